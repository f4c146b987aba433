"""Every ``pip install`` in README.md and docs/ works as written: lightning_gaudi is not on PyPI yet, so the docs
install it from a clone (``pip install .``, ``pip install ".[extra]"``) or from the wheel that
``scripts/check-dist.sh`` builds, never by name from the registry; the other names they install are on PyPI.
``scripts/check-dist.sh`` (a CI step) builds the wheel and installs it into a fresh virtual environment."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs").rglob("Dockerfile"))]
#: Names the docs install from PyPI, each checked there (pip resolves them): add one only after checking it.
ON_PYPI = {"litgpt", "neural-compressor-pt", "hydra-submitit-launcher", "habana-pyhlml"}
#: pip options that take a value (skipped with it).
VALUE_OPTIONS = {"-c", "--constraint", "-r", "--requirement", "-i", "--index-url", "--extra-index-url", "-f"}
#: The wheel as scripts/check-dist.sh names it (dist/ beside the clone, or copied elsewhere).
WHEEL = re.compile(r"(dist/)?lightning_gaudi-(\*|[\w.]+-py3-none-any)\.whl")
#: What the docs call our package from the registry, which has no such distribution.
OURS = canonicalize_name("lightning-gaudi")


def pip_installs(text: str) -> list[str]:
    """Each ``pip install ...`` command in ``text``: in inline code (up to the closing backtick) or on a line of a code
    block or Dockerfile (up to a comment). A bare `pip install` is prose about the commands, not one."""
    commands = []
    for match in re.finditer(r"\bpip install\b([^`\n]*)", text):
        arguments = match.group(1).split(" #")[0].strip()
        if arguments:
            commands.append(f"pip install {arguments}")
    return commands


def extras() -> set[str]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return set(tomllib.load(f)["project"]["optional-dependencies"])


def targets(command: str) -> list[str]:
    """What ``command`` installs (its options dropped)."""
    words = shlex.split(re.sub(r"<[^>]*>", "PLACEHOLDER", command))[2:]  # `@<your Gaudi software version>`
    found, skip = [], False
    for word in words:
        if skip:
            skip = False
        elif word in VALUE_OPTIONS:
            skip = True
        elif not word.startswith("-"):
            found.append(word)
    return found


def problem(target: str) -> str | None:
    """Why ``pip install TARGET`` does not work as written on a fresh machine, or ``None``."""
    local, _, rest = target.partition("[")
    wanted = set(rest.rstrip("]").split(",")) - {""} if rest else set()
    if local == "." or WHEEL.fullmatch(local):
        unknown = wanted - extras()
        return f"no extra {sorted(unknown)} in pyproject.toml" if unknown else None
    if local.startswith(("./", "/", "dist/")) or local.endswith(".whl"):
        return f"{local}: not the clone (.) nor the wheel scripts/check-dist.sh builds (dist/lightning_gaudi-*.whl)"
    if target.startswith("git+https://"):
        return None  # a repository, not the registry (Intel's DeepSpeed fork)
    try:
        name = canonicalize_name(Requirement(target).name)
    except InvalidRequirement as error:
        return f"not a requirement pip reads: {error}"
    if name == OURS or name == canonicalize_name("lightning_gaudi"):
        return "lightning_gaudi is not on PyPI: install from a clone (pip install .) or the built wheel"
    if name not in ON_PYPI:
        return f"{name} is not known to be on PyPI: check it there, then add it to ON_PYPI"
    return None


COMMANDS = [(path.relative_to(ROOT), command) for path in DOCS for command in pip_installs(path.read_text())]


def test_the_commands_are_found() -> None:
    assert len(COMMANDS) >= 10, COMMANDS
    texts = {str(path) for path, _ in COMMANDS}
    assert {"README.md", "docs/compat.md", "docs/recipes.md", "docs/k8s/Dockerfile"} <= texts


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=[f"{p}: {c}" for p, c in COMMANDS])
def test_every_pip_install_names_only_installable_things(path: Path, command: str) -> None:
    installs = targets(command)
    assert installs, f"{path}: {command}: installs nothing"
    for target in installs:
        assert problem(target) is None, f"{path}: {command}: {problem(target)}"


def test_the_checker_refuses_the_registry_name() -> None:
    assert problem("lightning-gaudi") is not None
    assert problem("lightning_gaudi[ray]") is not None
    assert problem(".[no-such-extra]") is not None
    assert problem("lightning-gaudi-0.1.0.tar.gz") is not None
    assert problem("some-package-nobody-checked") is not None
    for fine in (".", ".[cli,hydra]", "dist/lightning_gaudi-*.whl", "lightning_gaudi-0.1.0-py3-none-any.whl", "litgpt"):
        assert problem(fine) is None, fine
    assert targets("pip install --no-cache-dir -c constraints.txt -e '.[ray]'") == [".[ray]"]


def test_the_docs_say_it_is_not_on_pypi_and_how_to_install_it() -> None:
    for path in (ROOT / "README.md", ROOT / "docs" / "compat.md"):
        text = " ".join(path.read_text().split())
        assert "not on PyPI yet" in text, path
        assert "scripts/check-dist.sh" in text, path
    assert (ROOT / "scripts" / "check-dist.sh").stat().st_mode & 0o111
    assert "scripts/check-dist.sh || status=$?" in (ROOT / ".ci" / "run").read_text()
