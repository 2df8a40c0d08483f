"""examples/copy_task.py, the notebook's example_simple_model in plain code: it runs as a reader runs it and
learns to copy."""

import math
import re
import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EPOCHS = 5  # fewer than the example's 20: enough to copy the sequence it decodes (4 already does)


@pytest.mark.slow
def test_the_plain_copy_example_learns_to_copy(capsys):
    example = runpy.run_path(str(ROOT / "examples" / "copy_task.py"))  # defines; __main__ is not run
    loss, copy = example["example_simple_model"](epochs=EPOCHS)
    assert copy[0].tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]  # the source, copied exactly
    losses = [float(x) for x in re.findall(r"eval loss (\S+)", capsys.readouterr().out)]
    assert len(losses) == EPOCHS and losses[-1] < losses[0] / 2
    assert math.isfinite(loss)
