"""Running a trained generator: its ONNX export (export.py) and session (session.py), full-frame translation
(frames.py), video (video.py), the served model (serving.py), how it is packed for MLflow (packing.py) and its
registration (registry.py).

Imports nothing from training, tracking or dev: the served model packs serving.py and what it imports, and no more
(packing.packed_files).
"""
