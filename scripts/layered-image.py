#!/usr/bin/env python3
"""Writes a many-layer image into an OCI layout, once per compression (gzip, zstd), with
the same uncompressed layers (the same diff IDs) under each tag.

    layered-image.py LAYOUT NAME SCALE

makes LAYOUT:NAME-gzip and LAYOUT:NAME-zstd. SCALE 1 is the big-image benchmark's image:
12 layers, 1.1 GiB uncompressed, compressing to about half (text-like data with random
runs): four layers of many small files, eight of a few large ones. A small SCALE makes the
same shape in a few hundred kilobytes, for the tests. Every scale also carries what a layer
applied out of order would get wrong: a file a later layer deletes (a whiteout), a
directory a later layer makes opaque, and busybox with a shell to look at the result.

The content is pseudo-random from a fixed seed: the same SCALE makes the same layers.
"""

import gzip
import hashlib
import io
import json
import os
import random
import shutil
import subprocess
import sys
import tarfile

WORDS = [
    "".join(random.Random(i).choice("abcdefghijklmnopqrstuvwxyz") for _ in range(2 + i % 9))
    for i in range(2048)
]


def text_pool():
    rng = random.Random(7)
    lines = [" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(80000)]
    return "\n".join(lines).encode()


POOL = text_pool()


def text(rng, n):
    """n bytes of word-like text with a random KiB every 4 KiB (about 2:1 with gzip)."""
    out = bytearray()
    while len(out) < n:
        start = rng.randrange(len(POOL) - 3072)
        out += POOL[start : start + 3072]
        out += rng.randbytes(1024)
    return bytes(out[:n])


class Layer:
    def __init__(self):
        self.buf = io.BytesIO()
        self.tar = tarfile.open(fileobj=self.buf, mode="w", format=tarfile.PAX_FORMAT)

    def add_dir(self, path, mode=0o755):
        info = tarfile.TarInfo(path)
        info.type, info.mode, info.mtime = tarfile.DIRTYPE, mode, 1700000000
        self.tar.addfile(info)

    def add_file(self, path, data, mode=0o644):
        info = tarfile.TarInfo(path)
        info.size, info.mode, info.mtime = len(data), mode, 1700000000
        self.tar.addfile(info, io.BytesIO(data))

    def add_symlink(self, path, target):
        info = tarfile.TarInfo(path)
        info.type, info.linkname, info.mtime = tarfile.SYMTYPE, target, 1700000000
        self.tar.addfile(info)

    def close(self):
        self.tar.close()
        return self.buf.getvalue()


def base_layer():
    layer = Layer()
    for d in ("bin", "data", "data/opq", "etc", "tmp"):
        layer.add_dir(d, 0o1777 if d == "tmp" else 0o755)
    with open("/bin/busybox", "rb") as f:
        layer.add_file("bin/busybox", f.read(), 0o755)
    for tool in ("sh", "ls", "cat", "test", "find", "wc", "sleep", "true", "md5sum", "sort", "xargs"):
        layer.add_symlink(f"bin/{tool}", "busybox")
    layer.add_file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n")
    layer.add_file("data/victim", b"a later layer deletes me\n")
    layer.add_file("data/opq/old", b"a later layer hides my directory\n")
    return layer.close()


def small_files_layer(i, rng, total):
    layer = Layer()
    layer.add_dir(f"data/small{i}")
    written, n = 0, 0
    while written < total:
        size = rng.randint(512, 16384)
        if n % 500 == 0:
            sub = f"data/small{i}/d{n // 500:03d}"
            layer.add_dir(sub)
        layer.add_file(f"{sub}/f{n:05d}", text(rng, size))
        written, n = written + size, n + 1
    if i == 2:
        # Deletes a file of the base layer: unpacked in any order, it must stay deleted.
        layer.add_file("data/.wh.victim", b"")
    if i == 3:
        # Hides what the base layer put in data/opq.
        layer.add_dir("data/opq")
        layer.add_file("data/opq/.wh..wh..opq", b"")
        layer.add_file("data/opq/new", b"only me\n")
    return layer.close()


def large_files_layer(i, rng, total):
    layer = Layer()
    layer.add_dir(f"data/large{i}")
    files = 3
    for j in range(files):
        layer.add_file(f"data/large{i}/blob{j}", text(rng, total // files))
    return layer.close()


def layers(scale):
    rng = random.Random(42)
    out = [base_layer()]
    for i in range(1, 5):
        out.append(small_files_layer(i, rng, int(64 * 2**20 * scale)))
    for i in range(5, 13):
        out.append(large_files_layer(i, rng, int(110 * 2**20 * scale)))
    return out


def sha256(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def put_blob(layout, data):
    digest = sha256(data)
    path = os.path.join(layout, "blobs", "sha256", digest.split(":")[1])
    if not os.path.exists(path):
        with open(path + ".tmp", "wb") as f:
            f.write(data)
        os.rename(path + ".tmp", path)
    return {"digest": digest, "size": len(data)}


def compress(kind, data):
    if kind == "gzip":
        return gzip.compress(data, compresslevel=6, mtime=0)
    return subprocess.run(
        ["zstd", "-3", "-T0", "-q", "-c"], input=data, check=True, capture_output=True
    ).stdout


def write_image(layout, tag, kind, tars):
    media = f"application/vnd.oci.image.layer.v1.tar+{kind}"
    layer_descs = []
    for tar in tars:
        desc = put_blob(layout, compress(kind, tar))
        desc["mediaType"] = media
        layer_descs.append(desc)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Cmd": ["/bin/sh"], "Env": ["PATH=/bin"]},
        "rootfs": {"type": "layers", "diff_ids": [sha256(t) for t in tars]},
    }
    config_desc = put_blob(layout, json.dumps(config).encode())
    config_desc["mediaType"] = "application/vnd.oci.image.config.v1+json"
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config_desc,
        "layers": layer_descs,
    }
    manifest_desc = put_blob(layout, json.dumps(manifest).encode())
    manifest_desc["mediaType"] = manifest["mediaType"]
    manifest_desc["annotations"] = {"org.opencontainers.image.ref.name": tag}
    index_path = os.path.join(layout, "index.json")
    with open(index_path) as f:
        index = json.load(f)
    index["manifests"] = [
        m
        for m in index["manifests"]
        if m.get("annotations", {}).get("org.opencontainers.image.ref.name") != tag
    ] + [manifest_desc]
    with open(index_path, "w") as f:
        json.dump(index, f)


def main():
    layout, name, scale = sys.argv[1], sys.argv[2], float(sys.argv[3])
    os.makedirs(os.path.join(layout, "blobs", "sha256"), exist_ok=True)
    if not os.path.exists(os.path.join(layout, "index.json")):
        with open(os.path.join(layout, "oci-layout"), "w") as f:
            json.dump({"imageLayoutVersion": "1.0.0"}, f)
        with open(os.path.join(layout, "index.json"), "w") as f:
            json.dump({"schemaVersion": 2, "manifests": []}, f)
    tars = layers(scale)
    for kind in ("gzip", "zstd"):
        write_image(layout, f"{name}-{kind}", kind, tars)
    total = sum(len(t) for t in tars)
    print(f"{name}: {len(tars)} layers, {total} bytes uncompressed")


if __name__ == "__main__":
    if shutil.which("zstd") is None:
        sys.exit("zstd is not installed")
    main()
