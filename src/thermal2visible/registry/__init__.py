"""The MLflow model registry: how an export is packed as a pyfunc (packing.py), the champion gate that registers
each export and moves the aliases (gate.py), what a model and a version are said to be in the registry and by
`make serve` (descriptions.py), and a registered version's files read back as data (version_files.py).
"""
