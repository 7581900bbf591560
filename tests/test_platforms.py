"""Every test file says where it runs (harness.runs_on): on the GPU machine
too, or on CPU only with its reason. A new file that says neither fails
here, so it cannot silently miss the GPU run (scripts/gpu_run.sh)."""
import ast
import pathlib

from harness import runs_on

pytestmark = runs_on("cpu", "gpu")

TESTS = pathlib.Path(__file__).parent


def _platform_mark(path):
    """The runs_on(...) call assigned to pytestmark in `path`, or None."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark"
                                                for t in node.targets):
            call = node.value
            if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "runs_on":
                return call
    return None


def test_every_test_file_says_where_it_runs():
    unmarked, unexplained = [], []
    for path in sorted(TESTS.glob("test_*.py")):
        call = _platform_mark(path)
        if call is None:
            unmarked.append(path.name)
            continue
        platforms = {a.value for a in call.args if isinstance(a, ast.Constant)}
        has_reason = any(k.arg == "reason" for k in call.keywords)
        if platforms != {"cpu", "gpu"} and not has_reason:
            unexplained.append(path.name)
    assert not unmarked, (f"{unmarked}: set `pytestmark = runs_on(\"cpu\", \"gpu\")`, or "
                          "runs_on(\"cpu\", reason=...) for a file that cannot run on the GPU")
    assert not unexplained, f"{unexplained}: runs on one platform only without a reason"
