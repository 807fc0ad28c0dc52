#!/usr/bin/env python3
"""Writes an image's SBOM, SPDX 2.3 JSON, from the package list deploy/images/build.sh writes.

Python standard library only. The list is the one the image carries at
/usr/share/gpufabric/packages.txt, one package a line:

  deb NAME VERSION ARCH            a Debian bookworm package (unpacked into the image)
  wheel NAME VERSION FILE SHA256   a PyPI wheel whose libraries are in the image
  crate NAME VERSION SOURCE        a Rust crate compiled into the binary (SOURCE: crates.io
                                   or workspace)

The document describes one package, the image (its manifest digest as checksum, a
pkg:oci purl), which CONTAINS every listed package, each with its purl (pkg:deb, pkg:pypi,
pkg:cargo) as scanners (Trivy, Grype, Dependency-Track) read them. Licences are left
NOASSERTION: the image carries each Debian package's copyright file and each wheel's
licence, but nothing here reads them.

The same inputs give the same bytes: keys sorted, packages in the list's order, the creation
time from --created (build.sh passes SOURCE_DATE_EPOCH's), the namespace from the digest.

  sbom.py --packages agent.packages --ref ghcr.io/gpufabric/fabric-agent:v0.3.0 \\
          --digest sha256:... --created 2026-11-29T00:00:00Z \\
          --source https://github.com/gpufabric/gpufabric --revision COMMIT \\
          --out fabric-agent.spdx.json
"""

import argparse
import json
import re
import sys
import urllib.parse


def spdx_id(kind, name, version):
    """SPDXRef-KIND-NAME-VERSION, with every character SPDX does not allow as '-'."""
    return "SPDXRef-" + re.sub(r"[^A-Za-z0-9.-]", "-", f"{kind}-{name}-{version}")


def quote(text):
    return urllib.parse.quote(text, safe="")


def package(kind, fields, source, revision):
    """One SPDX package for one line of the list, or a ValueError saying what is wrong."""
    want = {"deb": 3, "wheel": 4, "crate": 3}
    if len(fields) != want[kind]:
        raise ValueError(f"a {kind} line has {want[kind]} fields after '{kind}', not {len(fields)}")
    name, version = fields[0], fields[1]
    p = {
        "SPDXID": spdx_id(kind, name, version),
        "name": name,
        "versionInfo": version,
        "downloadLocation": "NOASSERTION",
        "filesAnalyzed": False,
        "licenseConcluded": "NOASSERTION",
        "licenseDeclared": "NOASSERTION",
        "copyrightText": "NOASSERTION",
        "primaryPackagePurpose": "LIBRARY",
    }
    if kind == "deb":
        arch = fields[2]
        p["supplier"] = "Organization: Debian"
        p["SPDXID"] = spdx_id(kind, name, f"{version}-{arch}")
        purl = f"pkg:deb/debian/{quote(name)}@{quote(version)}?arch={arch}&distro=debian-12"
    elif kind == "wheel":
        wheel_file, sha256 = fields[2], fields[3]
        if not sha256.startswith("sha256:"):
            raise ValueError(f"wheel {name}: the digest {sha256!r} is not sha256:HEX")
        p["packageFileName"] = wheel_file
        p["checksums"] = [{"algorithm": "SHA256", "checksumValue": sha256[len("sha256:"):]}]
        p["downloadLocation"] = f"https://pypi.org/simple/{name}/"
        p["supplier"] = "Organization: NVIDIA Corporation"
        purl = f"pkg:pypi/{quote(name)}@{quote(version)}"
    else:
        origin = fields[2]
        if origin == "workspace":
            p["downloadLocation"] = f"git+{source}@{revision.removesuffix('-dirty')}"
            p["supplier"] = "Organization: gpufabric"
            purl = f"pkg:cargo/{quote(name)}@{quote(version)}?vcs_url={quote('git+' + source)}"
        elif origin == "crates.io":
            p["downloadLocation"] = f"https://crates.io/api/v1/crates/{name}/{version}/download"
            purl = f"pkg:cargo/{quote(name)}@{quote(version)}"
        else:
            raise ValueError(f"crate {name}: source {origin!r} is neither crates.io nor workspace")
    p["externalRefs"] = [
        {"referenceCategory": "PACKAGE-MANAGER", "referenceType": "purl", "referenceLocator": purl}
    ]
    return p


def sbom(lines, ref, digest, created, source, revision):
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        raise ValueError(f"--digest {digest!r} is not sha256:<64 hex digits>")
    repository, _, tag = ref.rpartition(":")
    if not repository or "/" in tag:
        raise ValueError(f"--ref {ref!r} has no tag (REGISTRY/NAME:TAG)")
    name = repository.rsplit("/", 1)[-1]
    image = {
        "SPDXID": "SPDXRef-image",
        "name": ref,
        "versionInfo": tag,
        "downloadLocation": "NOASSERTION",
        "filesAnalyzed": False,
        "licenseConcluded": "NOASSERTION",
        "licenseDeclared": "NOASSERTION",
        "copyrightText": "NOASSERTION",
        "primaryPackagePurpose": "CONTAINER",
        "supplier": "Organization: gpufabric",
        "sourceInfo": f"built from {source} at commit {revision}",
        "checksums": [{"algorithm": "SHA256", "checksumValue": digest[len("sha256:"):]}],
        "externalRefs": [{
            "referenceCategory": "PACKAGE-MANAGER",
            "referenceType": "purl",
            "referenceLocator": f"pkg:oci/{name}@{quote(digest)}"
                                f"?repository_url={quote(repository)}&tag={quote(tag)}",
        }],
    }
    packages, relationships, seen = [image], [], set()
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        kind, *fields = line.split()
        if kind not in ("deb", "wheel", "crate"):
            raise ValueError(f"line {number}: {kind!r} is not deb, wheel or crate: {line}")
        try:
            p = package(kind, fields, source, revision)
        except ValueError as e:
            raise ValueError(f"line {number}: {e}: {line}") from None
        if p["SPDXID"] in seen:
            raise ValueError(f"line {number}: {kind} {fields[0]} {fields[1]} is listed twice")
        seen.add(p["SPDXID"])
        packages.append(p)
        relationships.append({"spdxElementId": "SPDXRef-image",
                              "relationshipType": "CONTAINS",
                              "relatedSpdxElement": p["SPDXID"]})
    if len(packages) == 1:
        raise ValueError("the package list names no package")
    return {
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": ref,
        "documentNamespace": f"{source}/sbom/{name}/{digest.replace(':', '-')}",
        "creationInfo": {
            "created": created,
            "creators": ["Organization: gpufabric", "Tool: gpufabric-deploy-images-sbom.py"],
        },
        "documentDescribes": ["SPDXRef-image"],
        "packages": packages,
        "relationships": [{"spdxElementId": "SPDXRef-DOCUMENT",
                           "relationshipType": "DESCRIBES",
                           "relatedSpdxElement": "SPDXRef-image"}] + relationships,
    }


def main():
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a.add_argument("--packages", required=True, help="the package list build.sh writes")
    a.add_argument("--ref", required=True, help="the image's REGISTRY/NAME:TAG")
    a.add_argument("--digest", required=True, help="the image's manifest digest, sha256:HEX")
    a.add_argument("--created", required=True, help="creation time, YYYY-MM-DDTHH:MM:SSZ")
    a.add_argument("--source", required=True, help="the source repository's URL")
    a.add_argument("--revision", required=True, help="the commit the image is built from")
    a.add_argument("--out", required=True, help="where the SPDX JSON goes")
    args = a.parse_args()
    if not re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", args.created):
        sys.exit(f"sbom.py: --created {args.created!r} is not YYYY-MM-DDTHH:MM:SSZ")
    try:
        with open(args.packages, encoding="utf-8") as f:
            doc = sbom(f.readlines(), args.ref, args.digest, args.created, args.source,
                       args.revision)
    except (OSError, ValueError) as e:
        sys.exit(f"sbom.py: {args.packages}: {e}")
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"sbom.py: {args.out}: {len(doc['packages']) - 1} packages in {args.ref}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
