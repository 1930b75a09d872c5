"""Checks the OCI image layout scripts/build-image wrote.

usage: check_image.py LAYOUT TAG BINARY
The image's config: non-root user 65532:65532, entrypoint /usr/local/bin/moat, the
data directory in the environment; its single layer: the binary (byte-identical to
BINARY, executable), /etc/passwd naming the user, /etc/group, /var/lib/moat owned by
the user, and nothing else beyond directories, nsswitch.conf and /tmp.
"""
import hashlib
import json
import os
import sys
import tarfile


def blob(layout, digest):
    algo, hexd = digest.split(":", 1)
    path = os.path.join(layout, "blobs", algo, hexd)
    with open(path, "rb") as f:
        data = f.read()
    if hashlib.sha256(data).hexdigest() != hexd:
        fail(f"blob {digest} does not match its digest")
    return data


def fail(msg):
    print(f"check_image: {msg}", file=sys.stderr)
    sys.exit(1)


def main():
    layout, tag, binary = sys.argv[1:4]
    with open(os.path.join(layout, "oci-layout")) as f:
        if json.load(f).get("imageLayoutVersion") != "1.0.0":
            fail("not an OCI image layout 1.0.0")
    with open(os.path.join(layout, "index.json")) as f:
        index = json.load(f)
    refs = [m for m in index["manifests"]
            if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag]
    if len(refs) != 1:
        fail(f"tag {tag} not in index.json")
    manifest = json.loads(blob(layout, refs[0]["digest"]))
    config = json.loads(blob(layout, manifest["config"]["digest"]))
    c = config["config"]
    checks = {
        "user": c.get("User") == "65532:65532",
        "entrypoint": c.get("Entrypoint") == ["/usr/local/bin/moat"],
        "cmd": c.get("Cmd") == ["serve", "--config", "/etc/moat/moat.yaml"],
        "env": "MOAT_DATA_DIR=/var/lib/moat" in c.get("Env", []),
        "ports": set(c.get("ExposedPorts", {})) == {"8080/tcp", "9901/tcp"},
        "os/arch": (config.get("os"), config.get("architecture")) == ("linux", "amd64"),
    }
    bad = [k for k, ok in checks.items() if not ok]
    if bad:
        fail(f"config {bad}: {json.dumps(c)}")
    if len(manifest["layers"]) != 1:
        fail(f"{len(manifest['layers'])} layers, expected one (no base image)")
    import io
    members = {}
    with tarfile.open(fileobj=io.BytesIO(blob(layout, manifest["layers"][0]["digest"]))) as t:
        for m in t.getmembers():
            name = m.name.lstrip("./")
            members[name] = (m, t.extractfile(m).read() if m.isfile() else None)
    files = {n for n, (m, _) in members.items() if m.isfile()}
    expected = {"usr/local/bin/moat", "etc/passwd", "etc/group", "etc/nsswitch.conf"}
    if files != expected:
        fail(f"layer files {sorted(files)}, expected {sorted(expected)}")
    m, data = members["usr/local/bin/moat"]
    with open(binary, "rb") as f:
        if data != f.read():
            fail("the layer's binary differs from " + binary)
    if not m.mode & 0o111 or m.uid != 0:
        fail("the binary is not an executable owned by root")
    passwd = members["etc/passwd"][1].decode()
    if "moat:x:65532:65532:" not in passwd:
        fail(f"/etc/passwd has no moat user: {passwd!r}")
    d, _ = members.get("var/lib/moat", (None, None))
    if d is None or not d.isdir() or d.uid != 65532:
        fail("/var/lib/moat is not a directory owned by 65532")
    size = sum(len(v) for _, v in members.values() if v)
    print(f"check_image: {tag}: one layer, {len(members)} entries, {size / 1e6:.1f} MB of files; "
          f"user 65532:65532, entrypoint /usr/local/bin/moat; binary identical")


if __name__ == "__main__":
    main()
