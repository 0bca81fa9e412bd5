"""What tests and benchmarks share to run the project for real: MLflow and model servers on free 127.0.0.1 ports
(servers.py), serving images and their containers (containers.py), and copies of the project as a clone holds it
(projects.py)."""
