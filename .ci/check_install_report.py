"""Check a `pip install --dry-run --report` of `verl-search[EXTRA]`: the versions pip picked satisfy every pin.

Usage: python check_install_report.py REPORT.json EXTRA [EXPECTED_PACKAGE==VERSION | EXPECTED_PACKAGE ...]

pip's report lists each distribution it would install with its metadata. This walks the requirements
from the requested `verl-search[EXTRA]` down (the extras each requirement asks for included, markers
evaluated in the report's environment), and fails, naming the package, when:

* a requirement's specifier does not contain the version pip picked (e.g. verl's `transformers<5.11`
  against a transformers 5.12 that another package pulled in), or a required package is missing;
* an expected package (the rollout engine, `verl==0.9.1`) is not in the set or has another version.

Prints one line per picked expected package and exits 0, or one line per problem and exits 1.
Needs `packaging` (pip's own resolver uses the same rules).
"""

from __future__ import annotations

import json
import sys
from collections import deque

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version


def check_report(report: dict, root: str, extra: str, expected: list[str]) -> tuple[list[str], dict[str, str]]:
    """Problems (empty: fine) and the picked version of each expected package.

    Args:
        report: pip's `--report` JSON (version 1).
        root: the distribution whose extra was requested, e.g. `verl-search`.
        extra: the requested extra of `root`.
        expected: `name` (must be in the set) or `name==version` (must be that version).
    """
    environment = {key: str(value) for key, value in report["environment"].items()}
    picked = {canonicalize_name(item["metadata"]["name"]): item for item in report["install"]}
    problems: list[str] = []
    root_name = canonicalize_name(root)
    if root_name not in picked:
        return [f"{root} is not in the report"], {}
    queue = deque([(root_name, extra)])
    seen: set[tuple[str, str]] = set()
    while queue:
        name, with_extra = queue.popleft()
        if (name, with_extra) in seen:
            continue
        seen.add((name, with_extra))
        for line in picked[name]["metadata"].get("requires_dist", []):
            requirement = Requirement(line)
            marker_env = {**environment, "extra": with_extra}
            if requirement.marker is not None and not requirement.marker.evaluate(marker_env):
                continue
            if with_extra and (requirement.marker is None or "extra" not in str(requirement.marker)):
                # requirements without an extra marker are walked once, with the base distribution
                queue.append((name, ""))
                continue
            target = canonicalize_name(requirement.name)
            if target not in picked:
                problems.append(f"{line!r} (required by {name}) is not in the install set")
                continue
            version = picked[target]["metadata"]["version"]
            if not requirement.specifier.contains(Version(version), prereleases=True):
                problems.append(f"{requirement.name} {version} was picked, but {name} requires {requirement}")
            queue.append((target, ""))
            for wanted in requirement.extras:
                queue.append((target, canonicalize_name(wanted)))
    versions = {}
    for spec in expected:
        requirement = Requirement(spec)
        target = canonicalize_name(requirement.name)
        if target not in picked:
            problems.append(f"expected {spec}, but {requirement.name} is not in the install set")
            continue
        version = picked[target]["metadata"]["version"]
        versions[requirement.name] = version
        if not requirement.specifier.contains(Version(version), prereleases=True):
            problems.append(f"expected {spec}, but pip picked {requirement.name} {version}")
    return problems, versions


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    path, extra, *expected = argv
    with open(path, encoding="utf-8") as handle:
        report = json.load(handle)
    problems, versions = check_report(report, "verl-search", extra, expected)
    for problem in problems:
        print(f"[{extra}] {problem}", file=sys.stderr)
    if problems:
        return 1
    environment = report["environment"]
    print(f"[{extra}] {len(report['install'])} distributions for Python {environment['python_version']}; "
          + ", ".join(f"{name} {version}" for name, version in versions.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
