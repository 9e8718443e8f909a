"""A stand-in for KernelBench's package with the same entry points, for the benchmark's own tests:
it answers from markers in the candidate source (bench/../suite/candidate_variants.py's edits)
instead of running anything. None of KernelBench's code is here."""
