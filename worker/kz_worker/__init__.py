"""KernelZero's evaluation worker: the thin Python process that executes PyTorch references and
candidate kernels. The C++ supervisor (eval/) starts one worker per evaluation, sends it a JSON
request on stdin and reads stage events and the verdict on fd 3 (see protocol.py)."""
