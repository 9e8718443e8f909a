"""Compiling a candidate: what differs between the kernel formats (formats.py), and load_inline as a
`cuda` candidate's process runs it (load_inline.py), with the sources' lighter headers
(lighter_headers.py)."""
