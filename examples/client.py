"""Translate one thermal image with a running model server:

    python examples/client.py thermal.png visible.png --url http://HOST:PORT

The server is `make serve` (pipelines/serve.py: params.yaml's serve.host and serve.port; it prints the command).
"""

import argparse
import base64
import sys
from pathlib import Path

import requests

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("thermal", type=Path, help="PNG, JPEG or TIFF thermal image (8- or 16-bit)")
parser.add_argument("visible", type=Path, help="where to write the visible PNG")
parser.add_argument("--url", required=True, help="model server, e.g. http://127.0.0.1:5001")
args = parser.parse_args()

body = {"dataframe_split": {"columns": ["image"], "data": [[base64.b64encode(args.thermal.read_bytes()).decode()]]}}
response = requests.post(f"{args.url}/invocations", json=body, timeout=120)
if response.status_code != 200:  # the server says what is wrong in JSON {"error_code", "message"}
    sys.exit(f"error: HTTP {response.status_code}: {response.text}")
args.visible.write_bytes(base64.b64decode(response.json()["predictions"][0]["image"]))
print(f"wrote {args.visible}")
