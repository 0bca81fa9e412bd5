"""Running an exported generator on onnxruntime: its session (session.py), full-frame translation (frames.py), video
(video.py), the served model (serving.py, behind served_model.py) in worker processes under OS limits (workers.py),
and HTTP in front of it (edge.py, rest.py).

Imports nothing from training, tracking, registry or dev: the served model packs serving.py and what it imports, and
no more (registry.packing.packed_files).
"""
