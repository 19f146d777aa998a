"""docs/api.md's generated blocks are what docs/generate_api_reference.py makes of the code today."""

import difflib
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def generator():
    spec = importlib.util.spec_from_file_location(
        "generate_api_reference", ROOT / "docs" / "generate_api_reference.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_api_reference_is_generated_from_the_code(generator):
    # In a fresh interpreter, as a reader's import sees the code: what earlier tests did in this process (modes or
    # backends registered for a while) must not decide the verdict.
    check = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "generate_api_reference.py"), "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if check.returncode != 0:
        text = generator.API_MD.read_text(encoding="utf-8")
        regenerated, _ = generator.regenerate(text)
        diff = "\n".join(difflib.unified_diff(text.splitlines(), regenerated.splitlines(), lineterm="", n=0))
        pytest.fail(f"{check.stdout}{check.stderr}\nIn this process the difference reads:\n{diff[:4000]}")


def test_a_drifted_block_is_named_and_only_generated_blocks_are_rewritten(generator):
    text, _ = generator.regenerate(generator.API_MD.read_text(encoding="utf-8"))  # up to date, whatever the file is
    drifted = text.replace("<!-- generated: seams -->\n", "<!-- generated: seams -->\nAn old sentence.\n", 1)
    drifted = drifted.replace("## The command line\n", "## The command line\n\nA guide's own sentence.\n", 1)
    regenerated, changed = generator.regenerate(drifted)
    assert changed == ["seams"]
    assert "An old sentence." not in regenerated and "A guide's own sentence." in regenerated


def test_every_block_is_kept_and_no_unknown_block_is_accepted(generator):
    text = generator.API_MD.read_text(encoding="utf-8")
    without = text.replace("<!-- generated: seams -->", "<!-- not generated: seams -->", 1)
    with pytest.raises(ValueError, match="lacks the generated block"):
        generator.regenerate(without)
    unknown = text + "\n<!-- generated: nothing -->\n<!-- end of generated: nothing -->\n"
    with pytest.raises(ValueError, match="'nothing'"):
        generator.regenerate(unknown)


def test_the_reference_follows_each_packages_exports(generator, monkeypatch):
    import trl_ftis.swarm

    assert "trl_ftis.swarm" in generator.documented_packages()
    reference = generator.reference_block()
    for name in trl_ftis.swarm.__all__:
        assert f"#### `trl_ftis.swarm.{name}`" in reference
    monkeypatch.setattr(trl_ftis.swarm, "__all__", [*trl_ftis.swarm.__all__, "connect_swarm_again"], raising=True)
    monkeypatch.setattr(trl_ftis.swarm, "connect_swarm_again", trl_ftis.swarm.connect_swarm, raising=False)
    assert "#### `trl_ftis.swarm.connect_swarm_again`" in generator.reference_block()


def test_signatures_fit_the_page_and_carry_no_memory_addresses(generator):
    def a_long_function(first_argument_with_a_long_name: int, *, second: str = "x" * 90, third=object()) -> None:
        """What it is for.

        More detail that the reference leaves out."""

    text = generator.signature_text("a_long_function", a_long_function)
    assert text.startswith("a_long_function(\n") and all(len(line) <= generator.WIDTH for line in text.splitlines())
    assert "    *,\n" in text and " at 0x" not in text
    assert generator.summary(a_long_function) == "What it is for."
