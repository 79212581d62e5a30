"""The README's own-model example runs exactly as written, in a fresh process
(it starts its own local Ray cluster), and stays under 25 lines.

    .venv/bin/python -m pytest tests/ray/test_readme.py
"""

import re
import subprocess
import sys
from pathlib import Path

import keras
import pytest

pytestmark = pytest.mark.ray

README = Path(__file__).resolve().parents[2] / "README.md"


def own_model_example() -> str:
    section = README.read_text().split("## Train your own model", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readme_example_trains_and_saves_a_model(tmp_path):
    code = own_model_example()
    assert len(code.splitlines()) < 25
    (tmp_path / "example.py").write_text(code)
    done = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    assert "'mae'" in last and "'loss'" in last
    model = keras.models.load_model(tmp_path / "my_model.keras")
    assert model.count_params() > 0
