"""The seam guard: the TRL methods FTISTrainer overrides are the ones its overrides were written against."""

import ast
import importlib.util
import inspect
import textwrap

import pytest
from trl import GRPOTrainer

from trl_ftis import FTISTrainer
from trl_ftis.trl_seams import SEAMS, TRL_VERSION, changed_seams, fingerprint


def test_the_installed_trl_has_every_seam_as_it_was_written_against():
    changes = changed_seams()
    lines = "\n".join(f"  * {change.describe()}" for change in changes)
    assert not changes, (
        f"TRL changed {len(changes)} method(s) FTISTrainer overrides since TRL {TRL_VERSION}:\n{lines}\n"
        "Re-read each changed TRL method next to its override in trl_ftis.trainer; when the override still holds "
        "(tests/core/test_trainer.py and tests/core/test_dropin.py pass), record the installed fingerprint and TRL "
        "version in src/trl_ftis/trl_seams.py."
    )


def test_the_list_holds_every_method_ftistrainer_overrides_or_wraps():
    overridden = {
        name
        for name, value in vars(FTISTrainer).items()
        if callable(value) and hasattr(GRPOTrainer, name) and name not in ("__class__", "__doc__")
    }
    assert overridden == {seam.method for seam in SEAMS}
    assert len({seam.method for seam in SEAMS}) == len(SEAMS)


def _planted_trl(tmp_path, method, edit):
    """A stand-in for TRL's `GRPOTrainer`: TRL's own, except `method`, whose source `edit` rewrites (in a module on
    disk, so that `inspect.getsource` reads it as it reads TRL's)."""
    function = ast.parse(textwrap.dedent(inspect.getsource(getattr(GRPOTrainer, method)))).body[0]
    function.decorator_list = []  # TRL's decorators are not importable from the stand-in module
    source = (
        "from __future__ import annotations\n\nclass GRPOTrainer:\n"
        + textwrap.indent(edit(ast.unparse(function)), "    ")
        + "\n"
    )
    path = tmp_path / "planted_trl.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("planted_trl", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return type("GRPOTrainer", (module.GRPOTrainer, GRPOTrainer), {})


def _one_statement_more(source: str) -> str:
    tree = ast.parse(source)
    tree.body[0].body.insert(0, ast.parse("planted = None").body[0])
    return ast.unparse(tree)


@pytest.mark.parametrize("method", ["_compute_loss", "_generate_and_score_completions", "_save_checkpoint"])
def test_a_changed_trl_method_fails_the_guard_naming_that_seam_only(tmp_path, method):
    changes = changed_seams(_planted_trl(tmp_path, method, _one_statement_more))
    assert [change.seam.method for change in changes] == [method]
    message = changes[0].describe()
    seam = next(seam for seam in SEAMS if seam.method == method)
    assert f"GRPOTrainer.{method}" in message and seam.fingerprint in message
    assert f"Re-read the installed {method} next to FTISTrainer.{method}" in message
    assert fingerprint(getattr(_planted_trl(tmp_path, method, _one_statement_more), method)) in message


def test_comments_docstrings_and_layout_do_not_count_as_a_change(tmp_path):
    def reformatted(source: str) -> str:
        tree = ast.parse(source)
        tree.body[0].body.insert(0, ast.Expr(ast.Constant("A docstring TRL rewrote.")))
        header, _, body = ast.unparse(tree).partition("\n")
        return f"{header}\n    # a comment TRL added\n\n{body}\n"

    assert changed_seams(_planted_trl(tmp_path, "_compute_loss", reformatted)) == []


def test_a_seam_that_moved_to_another_class_or_vanished_is_named():
    class Trainer:  # `training_step` now defined by another class than TRL's GRPOTrainer
        def training_step(self, model, inputs, num_items_in_batch):
            return None

    moved = type("GRPOTrainer", (Trainer, GRPOTrainer), {})
    assert [change.seam.method for change in changed_seams(moved)] == ["training_step"]
    assert "installed: test_a_seam_that_moved" in changed_seams(moved)[0].describe()

    vanished = next(seam for seam in SEAMS if seam.method == "_generate")
    renamed = type(vanished)("_generate_renamed", vanished.owner, "override", "", "", vanished.fingerprint)
    assert [change.found for change in changed_seams(GRPOTrainer, (renamed,))] == ["no such method"]
