#!/usr/bin/env python3
"""Writes an OCI image archive from directories, one layer each, reproducibly.

Python standard library only. The archive is an OCI image layout in a tar (oci-layout,
index.json, blobs/sha256/...) that `ctr -n k8s.io images import FILE` loads and
`skopeo copy oci-archive:FILE docker://REGISTRY/NAME:TAG` pushes.

The same inputs give the same bytes, and so the same manifest digest:
  - tar entries sorted by path, every parent directory before its children;
  - owner 0:0 (uid and gid numbers only, no names) unless --chown says otherwise;
  - modes fixed: directories 0755, files 0755 when the owner may execute them, else 0644,
    symbolic links 0777; --mode overrides one path;
  - mtime of every entry = --epoch (default $SOURCE_DATE_EPOCH, else 0); PAX headers only
    where a name or size needs one, never atime or ctime;
  - gzip with mtime 0 and no file name; JSON with sorted keys.
Hard links are stored as regular files; devices, fifos and sockets are refused.

One layer from a directory (for example a pause image):

  oci.py --rootfs DIR --ref docker.io/local/pause:1 --entrypoint /pause --out pause.tar

Several layers, in order, lowest first, with the image config:

  oci.py --layer base/ --layer libs/ --layer bin/ \\
         --ref ghcr.io/gpufabric/fabric-agent:v0.1.0 \\
         --entrypoint /usr/local/bin/fabric-agent --cmd node-check \\
         --user 65532:65532 --env LD_LIBRARY_PATH=/opt/gpufabric/lib \\
         --label org.opencontainers.image.revision=abc123 \\
         --chown home/nonroot=65532:65532 --mode home/nonroot=0700 --mode tmp=1777 \\
         --out fabric-agent.oci.tar --summary fabric-agent.json

--entrypoint and --cmd take one word, or a JSON list for several
('["/bin/app", "--flag"]'). The index carries the reference in both
org.opencontainers.image.ref.name and io.containerd.image.name, so containerd
imports it under that name. Prints `REF@DIGEST` and the sizes; --summary writes
them as JSON (digest, sizes, each layer's digest and diff id).
"""

import argparse
import datetime
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import stat
import sys
import tarfile
import tempfile

MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
DEFAULT_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# A reference with a registry host and a tag or digest: what containerd needs to name it.
FULL_REF = re.compile(r"^[a-z0-9.-]+(:[0-9]+)?/[a-z0-9._/-]+(:[A-Za-z0-9_][A-Za-z0-9._-]{0,127}|@sha256:[0-9a-f]{64})$")


class Refusal(Exception):
    """An input this script will not turn into an image; the message says why."""


class HashingWriter:
    """A write-only file that passes bytes on and counts and hashes them."""

    def __init__(self, inner):
        self.inner = inner
        self.sha = hashlib.sha256()
        self.size = 0

    def write(self, data):
        self.sha.update(data)
        self.size += len(data)
        return self.inner.write(data)

    def digest(self):
        return "sha256:" + self.sha.hexdigest()


def dumps(obj):
    """Canonical JSON: sorted keys, no spaces, UTF-8."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def normalise(path):
    """'/usr/bin/' -> 'usr/bin': paths inside the image as tar names carry them."""
    path = path.strip("/")
    if path in ("", "."):
        raise Refusal("a path in the image must not be the root itself")
    return os.path.normpath(path)


def parse_assignments(items, what, value_check):
    out = {}
    for item in items:
        if "=" not in item:
            raise Refusal(f"{what} takes PATH=VALUE, got {item!r}")
        path, value = item.rsplit("=", 1)
        out[normalise(path)] = value_check(value, item)
    return out


def parse_owner(value, item):
    m = re.fullmatch(r"(\d+):(\d+)", value)
    if not m:
        raise Refusal(f"--chown takes PATH=UID:GID with numbers, got {item!r}")
    return int(m.group(1)), int(m.group(2))


def parse_mode(value, item):
    if not re.fullmatch(r"[0-7]{3,4}", value):
        raise Refusal(f"--mode takes PATH=OCTAL (e.g. tmp=1777), got {item!r}")
    return int(value, 8)


def words(value, flag):
    """--entrypoint/--cmd: a JSON list, or one word."""
    if value is None:
        return None
    if value.startswith("["):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as e:
            raise Refusal(f"{flag} looks like a JSON list but is not one: {e}") from e
        if not isinstance(parsed, list) or not all(isinstance(w, str) for w in parsed):
            raise Refusal(f"{flag} must be a JSON list of strings")
        return parsed
    return [value]


class Layout:
    """Fixed ownership and modes for the entries of every layer."""

    def __init__(self, epoch, owners, modes):
        self.epoch = epoch
        self.owners = owners
        self.modes = modes

    def owner(self, name):
        # The longest --chown path that is this path or one of its parents.
        best = None
        for path, ids in self.owners.items():
            if name == path or name.startswith(path + "/"):
                if best is None or len(path) > len(best[0]):
                    best = (path, ids)
        return best[1] if best else (0, 0)

    def tarinfo(self, source, name):
        st = os.lstat(source)
        info = tarfile.TarInfo(name)
        info.mtime = self.epoch
        info.uid, info.gid = self.owner(name)
        info.uname = info.gname = ""
        if stat.S_ISLNK(st.st_mode):
            info.type = tarfile.SYMTYPE
            info.linkname = os.readlink(source)
            info.mode = 0o777
        elif stat.S_ISDIR(st.st_mode):
            info.type = tarfile.DIRTYPE
            info.mode = 0o755
        elif stat.S_ISREG(st.st_mode):
            info.type = tarfile.REGTYPE
            info.size = st.st_size
            info.mode = 0o755 if st.st_mode & stat.S_IXUSR else 0o644
        else:
            raise Refusal(f"{source}: only files, directories and symbolic links can go in a layer")
        if name in self.modes:
            info.mode = self.modes[name]
        return info


def walk(root):
    """(source path, name in the image) for everything under root, depth first in sorted
    order: each directory, then what it holds."""
    if not os.path.isdir(root):
        raise Refusal(f"layer directory {root} does not exist")

    def under(prefix, directory):
        for entry in sorted(os.listdir(directory)):
            source = os.path.join(directory, entry)
            name = f"{prefix}/{entry}" if prefix else entry
            yield source, name
            if os.path.isdir(source) and not os.path.islink(source):
                yield from under(name, source)

    return under("", root)


def write_layer(root, layout, blobs, level):
    """Writes one gzipped tar layer of root into blobs; returns its descriptor facts."""
    tmp = tempfile.NamedTemporaryFile(dir=blobs, delete=False)
    try:
        compressed = HashingWriter(tmp)
        gz = gzip.GzipFile(filename="", mode="wb", fileobj=compressed, compresslevel=level, mtime=0)
        plain = HashingWriter(gz)
        count = 0
        with tarfile.open(fileobj=plain, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for source, name in walk(root):
                info = layout.tarinfo(source, name)
                if info.isreg():
                    with open(source, "rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)
                count += 1
        gz.close()
        tmp.close()
        digest = compressed.digest()
        os.replace(tmp.name, os.path.join(blobs, digest.split(":", 1)[1]))
    except BaseException:
        tmp.close()
        os.unlink(tmp.name)
        raise
    return {
        "source": root,
        "digest": digest,
        "size": compressed.size,
        "diff_id": plain.digest(),
        "uncompressed_size": plain.size,
        "entries": count,
    }


def write_blob(blobs, data):
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    with open(os.path.join(blobs, digest.split(":", 1)[1]), "wb") as f:
        f.write(data)
    return digest


def rfc3339(epoch):
    return datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def build(args):
    if not FULL_REF.match(args.ref):
        raise Refusal(
            f"--ref {args.ref!r} is not a full reference (REGISTRY/NAME:TAG, e.g. "
            "ghcr.io/gpufabric/fabric-operator:v0.1.0); containerd imports the image under it"
        )
    if not args.layers:
        raise Refusal("no layer: give --rootfs DIR or one --layer DIR per layer")
    epoch = args.epoch
    if epoch is None:
        raw = os.environ.get("SOURCE_DATE_EPOCH", "0")
        if not raw.isdigit():
            raise Refusal(f"SOURCE_DATE_EPOCH must be a whole number of seconds, got {raw!r}")
        epoch = int(raw)
    layout = Layout(
        epoch,
        parse_assignments(args.chown, "--chown", parse_owner),
        parse_assignments(args.mode, "--mode", parse_mode),
    )
    env = []
    for item in args.env:
        if "=" not in item:
            raise Refusal(f"--env takes NAME=VALUE, got {item!r}")
        env.append(item)
    if not any(e.startswith("PATH=") for e in env):
        env.insert(0, DEFAULT_PATH)
    labels = {}
    for item in args.label:
        if "=" not in item:
            raise Refusal(f"--label takes KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        labels[key] = value
    annotations = {}
    for item in args.annotation:
        if "=" not in item:
            raise Refusal(f"--annotation takes KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        annotations[key] = value

    out_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(out_dir, exist_ok=True)
    work = tempfile.mkdtemp(prefix=".oci-", dir=out_dir)
    try:
        blobs = os.path.join(work, "blobs", "sha256")
        os.makedirs(blobs)
        layers = [write_layer(root, layout, blobs, args.gzip_level) for root in args.layers]

        created = rfc3339(epoch)
        container = {"Env": env}
        for key, value in (
            ("Entrypoint", words(args.entrypoint, "--entrypoint")),
            ("Cmd", words(args.cmd, "--cmd")),
            ("User", args.user),
            ("WorkingDir", args.workdir),
            ("Labels", labels or None),
        ):
            if value is not None:
                container[key] = value
        config = {
            "created": created,
            "architecture": args.arch,
            "os": "linux",
            "config": container,
            "rootfs": {"type": "layers", "diff_ids": [layer["diff_id"] for layer in layers]},
            "history": [
                {"created": created, "created_by": f"oci.py --layer {os.path.basename(os.path.normpath(layer['source']))}"}
                for layer in layers
            ],
        }
        config_bytes = dumps(config)
        config_digest = write_blob(blobs, config_bytes)
        manifest = {
            "schemaVersion": 2,
            "mediaType": MEDIA_MANIFEST,
            "config": {"mediaType": MEDIA_CONFIG, "digest": config_digest, "size": len(config_bytes)},
            "layers": [{"mediaType": MEDIA_LAYER, "digest": layer["digest"], "size": layer["size"]} for layer in layers],
        }
        if annotations:
            manifest["annotations"] = annotations
        manifest_bytes = dumps(manifest)
        manifest_digest = write_blob(blobs, manifest_bytes)
        index = {
            "schemaVersion": 2,
            "mediaType": MEDIA_INDEX,
            "manifests": [
                {
                    "mediaType": MEDIA_MANIFEST,
                    "digest": manifest_digest,
                    "size": len(manifest_bytes),
                    "platform": {"architecture": args.arch, "os": "linux"},
                    "annotations": {
                        "org.opencontainers.image.ref.name": args.ref,
                        "io.containerd.image.name": args.ref,
                    },
                }
            ],
        }
        with open(os.path.join(work, "index.json"), "wb") as f:
            f.write(dumps(index))
        with open(os.path.join(work, "oci-layout"), "wb") as f:
            f.write(dumps({"imageLayoutVersion": "1.0.0"}))

        # The archive itself is as reproducible as its blobs: same order, owners and times.
        plain = Layout(epoch, {}, {})
        tmp_out = args.out + ".tmp"
        with tarfile.open(tmp_out, "w", format=tarfile.PAX_FORMAT) as tar:
            names = ["oci-layout", "index.json", "blobs", "blobs/sha256"]
            names += [f"blobs/sha256/{b}" for b in sorted(os.listdir(blobs))]
            for name in names:
                source = os.path.join(work, name)
                info = plain.tarinfo(source, name)
                if info.isreg():
                    with open(source, "rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)
        os.replace(tmp_out, args.out)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    compressed = len(config_bytes) + len(manifest_bytes) + sum(layer["size"] for layer in layers)
    summary = {
        "ref": args.ref,
        "digest": manifest_digest,
        "config_digest": config_digest,
        "compressed_size": compressed,
        "uncompressed_size": sum(layer["uncompressed_size"] for layer in layers),
        "archive": args.out,
        "archive_size": os.path.getsize(args.out),
        "layers": [{k: v for k, v in layer.items()} for layer in layers],
    }
    if args.summary:
        with open(args.summary, "w") as f:
            json.dump(summary, f, indent=2, sort_keys=True)
            f.write("\n")
    print(f"{args.ref}@{manifest_digest}  {len(layers)} layer(s), {compressed} bytes compressed, "
          f"{summary['uncompressed_size']} uncompressed -> {args.out}")
    return summary


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="oci.py",
        description=__doc__.split("\n\n", 1)[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--layer", "--rootfs", dest="layers", action="append", default=[], metavar="DIR",
                        help="a directory that becomes one layer (repeat, lowest first); --rootfs is the same")
    parser.add_argument("--ref", required=True,
                        help="full reference the image is imported and pushed under, REGISTRY/NAME:TAG")
    parser.add_argument("--out", required=True, metavar="FILE", help="the OCI archive (a tar) to write")
    parser.add_argument("--entrypoint", help="one word, or a JSON list of words")
    parser.add_argument("--cmd", help="default arguments: one word, or a JSON list of words")
    parser.add_argument("--user", help="user the container runs as; numeric UID:GID lets kubelet check runAsNonRoot")
    parser.add_argument("--workdir", help="working directory")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="environment (repeat); PATH gets the usual default unless given")
    parser.add_argument("--label", action="append", default=[], metavar="KEY=VALUE", help="image config label (repeat)")
    parser.add_argument("--annotation", action="append", default=[], metavar="KEY=VALUE",
                        help="manifest annotation (repeat)")
    parser.add_argument("--chown", action="append", default=[], metavar="PATH=UID:GID",
                        help="owner of PATH and everything under it (repeat); all else is 0:0")
    parser.add_argument("--mode", action="append", default=[], metavar="PATH=OCTAL",
                        help="mode of exactly PATH (repeat), e.g. tmp=1777")
    parser.add_argument("--arch", default="amd64", help="platform architecture (default amd64)")
    parser.add_argument("--epoch", type=int, help="mtime of every entry and the created time "
                        "(default $SOURCE_DATE_EPOCH, else 0)")
    parser.add_argument("--gzip-level", type=int, default=6, choices=range(1, 10), metavar="1-9",
                        help="gzip level (default 6); the digest depends on it")
    parser.add_argument("--summary", metavar="FILE", help="write digest, sizes and layers as JSON")
    args = parser.parse_args(argv)
    try:
        build(args)
    except Refusal as e:
        print(f"oci.py: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
