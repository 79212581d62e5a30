"""Every install command the project documents resolves to exactly one
TensorFlow distribution (`pip install --dry-run --report` against the package
index, as a user's pip would resolve it; nothing is installed).

`pip check` cannot see two distributions that write one `tensorflow` module
(tensorflow-cpu beside tensorflow), so the resolution itself is checked. A
real GPU cannot be tried here: that the GPU command brings GPU TensorFlow and
its CUDA libraries, and nothing else claims the module, is the check.
"""

import platform

import pytest

from tests.install.resolving import documented_extras, read, session_directory

pytestmark = [pytest.mark.install, pytest.mark.slow]

# Distributions that install the `tensorflow` module.
TENSORFLOWS = {"tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-intel",
               "tensorflow-macos", "tensorflow-aarch64", "intel-tensorflow", "tf-nightly",
               "tf-nightly-cpu", "tf-nightly-gpu"}
RESOLVE_TIMEOUT_S = 900.0


@pytest.fixture(scope="module")
def resolutions(request) -> dict[str, list[str]]:
    """{extras: names of the distributions `pip install ./[extras]` would install, fresh}.

    Read from the resolutions the session started in the background as it
    collected these tests (tests/conftest.py): blocks only until they end.
    """
    directory = session_directory(request.config)
    assert directory, "the session started no resolutions (tests/conftest.py starts them)"
    return {extras: read(directory, extras, RESOLVE_TIMEOUT_S) for extras in documented_extras()}


def test_the_documents_name_the_cpu_and_the_gpu_install_and_nothing_without_tensorflow():
    found = documented_extras()
    extras = {frozenset(e.split(",")) - {"test"} for e in found}
    assert extras == {frozenset({"cpu"}), frozenset({"gpu"})}, found
    assert any("README.md" == d for d in found["cpu"]) and "README.md" in found["gpu"]


@pytest.mark.parametrize("extras", sorted(documented_extras()))
def test_each_documented_install_resolves_exactly_one_tensorflow(resolutions, extras):
    names = resolutions[extras]
    tensorflows = sorted(TENSORFLOWS & set(names))
    assert len(tensorflows) == 1, f"pip install '.[{extras}]' resolves {tensorflows}"
    if "gpu" in extras.split(","):
        assert tensorflows == ["tensorflow"]
        assert "nvidia-cudnn-cu12" in names  # the and-cuda libraries came along
    elif platform.machine() == "x86_64":
        assert tensorflows == ["tensorflow-cpu"]  # the small CPU build
        assert not any(n.startswith("nvidia-") for n in names)
