#!/usr/bin/env bash
# A Debian base for the serving image, built without an image registry: debootstrap from Debian's mirror, imported
# into Docker as $1 (`make image` runs it when no --base is given and the tag is missing). Python 3.11 and pip's
# CA bundle: where pip is configured with a bundle of its own (a proxy's), the image's pip uses it too.
set -euo pipefail
tag=${1:?usage: debian-base.sh TAG [MIRROR]}
mirror=${2:-http://deb.debian.org/debian}
rootfs=$(mktemp -d)
trap 'rm -rf "$rootfs"' EXIT
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$rootfs" "$mirror" >/dev/null
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/*
changes=(-c 'CMD ["bash"]')
cert=${PIP_CERT:-$(python3 -m pip config get global.cert 2>/dev/null || true)}
if [ -n "$cert" ] && [ -f "$cert" ]; then
  cp "$cert" "$rootfs/etc/ssl/certs/pip-bundle.crt"
  changes+=(-c 'ENV PIP_CERT=/etc/ssl/certs/pip-bundle.crt')
fi
tar -C "$rootfs" -c . | docker import "${changes[@]}" - "$tag" >/dev/null
echo "built the base image $tag"
