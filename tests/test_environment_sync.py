"""environment.yml and pyproject.toml must list the same packages with the same ranges."""

import re
from pathlib import Path

import tomllib
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent


def normalise(req: str) -> tuple[str, str, str]:
    r = Requirement(req)
    return re.sub(r"[-_.]+", "-", r.name).lower(), str(r.specifier), str(r.marker or "")


def pyproject_requirements() -> set:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        reqs += extra
    return {normalise(r) for r in reqs}


def environment_requirements() -> tuple[set, list[str]]:
    """Parse the small YAML subset environment.yml uses (no PyYAML dependency needed)."""
    conda, pip, section = [], [], None
    for line in (ROOT / "environment.yml").read_text().splitlines():
        stripped = line.split(" #", 1)[0].rstrip() if not line.lstrip().startswith("#") else ""
        if not stripped.strip():
            continue
        if re.match(r"^\S", stripped):
            section = stripped.split(":")[0]
            continue
        item = stripped.strip()
        if item == "- pip:":
            section = "pip"
            continue
        if item.startswith("- ") and section in ("dependencies", "pip"):
            into = pip if section == "pip" and line.startswith("      ") else conda
            into.append(item[2:].strip())
    return conda, pip


def test_same_packages_and_ranges():
    conda, pip = environment_requirements()
    assert "-e ." in pip, "the course package itself belongs in environment.yml's pip section"
    assert any(c.startswith("python=") for c in conda)
    conda_reqs = [c.replace("=", "==", 1) if re.match(r"^[\w-]+=\d", c) else c
                  for c in conda if not c.startswith(("python=", "pip"))]
    env = {normalise(r) for r in conda_reqs + [p for p in pip if p != "-e ."]}
    py = pyproject_requirements()
    assert env == py, (f"only in environment.yml: {sorted(env - py)}; "
                       f"only in pyproject.toml: {sorted(py - env)}")


def test_torch_comes_from_pip_and_is_pinned_in_constraints():
    _, pip = environment_requirements()
    assert any(p.startswith("torch") for p in pip), \
        "torch must be installed by pip (CPU wheel), not conda"
    constraints = (ROOT / "constraints.txt").read_text()
    assert re.search(r"^torch==\d+\.\d+\.\d+$", constraints, re.M), \
        "constraints.txt must pin torch exactly"
    pins = {normalise(line)[0] for line in constraints.splitlines()
            if line and not line.startswith("#")}
    missing = {name for name, _, _ in pyproject_requirements()} - pins
    assert not missing, f"constraints.txt pins no version for {sorted(missing)}"
