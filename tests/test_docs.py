"""The docs against the tree: README.md names the whole public API, and no
doc (README.md, docs/*.md) links or names a repository file that does not
exist. (README's code blocks run in tests/test_readme.py.)"""
import ast
import fnmatch
import inspect
import os
import pathlib
import re
import subprocess

import jax_ar

from harness import runs_on

pytestmark = runs_on("cpu", "gpu")

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]

# Top-level folders of the repository: a word starting with one of these and
# a slash names a file or folder of it.
TREE_FOLDERS = ("jax_ar", "cuda", "scripts", "docs", "tests", "examples", "benchmarks")
# Names that look like repository paths but are not meant to be ones.
NOT_REPOSITORY_FILES = {
    "examples/gemma": "google/flax's Gemma example, which the docs cite",
    "jax_ar/_jax_ar_*.so": "the compiled modules: build outputs",
    "jax_ar/PREBUILT": "written by scripts/build_for_gpu.sh next to prebuilt modules",
}
_PATH = re.compile(r"(?<![\w./-])((?:%s)/[\w./*{},-]*[\w*}])" % "|".join(TREE_FOLDERS))
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_BACKTICKED_FILE = re.compile(r"`([\w.-]+\.(?:py|md|h|cc|cu|cuh|sh))`")


def _public_flax_names() -> list:
    """jax_ar.flax.__all__, read from its source (importing it needs flax)."""
    tree = ast.parse((ROOT / "jax_ar" / "flax.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__"
                                                for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("jax_ar/flax.py has no __all__")


def _words(text: str) -> set:
    return set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text))


def test_readme_names_every_public_name():
    words = _words(README.read_text())
    missing = [n for n in list(jax_ar.__all__) + _public_flax_names() if n not in words]
    assert not missing, f"README.md does not name {missing} (jax_ar.__all__, jax_ar.flax)"


def _parameters(fn) -> list:
    return [p.name for p in inspect.signature(fn).parameters.values()
            if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


# The leading parameters of the public API in the contract's order
# (the project's design document, README's "API"), so that a positional call
# means what it says there: rms_norm(x, gamma, 1e-6, 1.0) is scale_offset 1.0.
CONTRACT_ORDER = {
    "setup": ("mesh", "axis_name", "workspace_bytes", "timeout_s"),
    "all_reduce": ("x", "axis_name", "op", "algorithm"),
    "all_reduce_rms_norm": ("x", "residual", "gamma", "axis_name", "eps", "algorithm",
                            "quant_scale", "scale_offset", "post_gamma", "bias"),
    "rms_norm": ("x", "gamma", "eps", "scale_offset"),
    "matmul_all_reduce": ("x", "w", "axis_name"),
    "flax.RMSNorm": ("num_features", "eps", "scale_offset"),
    "flax.AllReduceRMSNorm": ("num_features", "axis_name", "eps", "scale_offset", "post_norm"),
    "flax.RowParallelLinear": ("in_features", "out_features", "axis_name", "use_bias"),
}


def test_public_parameters_in_the_contracts_order():
    try:
        import jax_ar.flax as ar_flax
    except ImportError:  # flax not installed: the functions are still checked
        ar_flax = None
    for name, order in CONTRACT_ORDER.items():
        if name.startswith("flax."):
            if ar_flax is None:
                continue
            parameters = _parameters(getattr(ar_flax, name[len("flax."):]).__init__)
        else:
            parameters = _parameters(getattr(jax_ar, name))
        assert tuple(parameters[:len(order)]) == order, (name, parameters)


def test_readme_names_every_parameter():
    """Every parameter of the public functions, and of the Flax modules'
    constructors and calls, is named in README.md."""
    words = _words(README.read_text())
    missing = {}
    for name in jax_ar.__all__:
        obj = getattr(jax_ar, name)
        if inspect.isfunction(obj):
            missing[name] = [p for p in _parameters(obj) if p not in words]
    try:
        import jax_ar.flax as ar_flax
    except ImportError:  # flax not installed: the functions are still checked
        ar_flax = None
    if ar_flax is not None:
        for name in ar_flax.__all__:
            cls = getattr(ar_flax, name)
            missing[f"flax.{name}"] = [p for p in _parameters(cls.__init__) +
                                       _parameters(cls.__call__) if p not in words]
    missing = {k: v for k, v in missing.items() if v}
    assert not missing, f"README.md does not name these parameters: {missing}"


def _repository_files() -> set:
    """The files of the work tree that git does not ignore: tracked ones and
    new ones alike (a copy of the tree whose .git is older than its files,
    as the GPU machine gets it, still lists every file)."""
    try:
        listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                                cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):  # not a git checkout (an sdist)
        listed = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file()]
    return {f for f in listed if (ROOT / f).exists()}  # deleted, not yet committed: gone


def _expand_braces(path: str) -> list:
    """cuda/gpu/capacity.{h,cc} -> cuda/gpu/capacity.h, cuda/gpu/capacity.cc"""
    m = re.search(r"\{([^{}]*)\}", path)
    if not m:
        return [path]
    return [e for alt in m.group(1).split(",")
            for e in _expand_braces(path[:m.start()] + alt + path[m.end():])]


def _names_in(doc: pathlib.Path):
    """(line, what, name) of every repository path, relative link and
    backticked file name in a doc."""
    in_fence = False
    for number, line in enumerate(doc.read_text().splitlines(), 1):
        if line.startswith("```"):
            in_fence = not in_fence
        for m in _PATH.finditer(line):
            yield number, "path", m.group(1).rstrip(".,")
        if in_fence:
            continue
        for m in _LINK.finditer(line):
            target = m.group(1).split("#", 1)[0]
            if target and not re.match(r"[a-z]+:", target):
                yield number, "link", target
        for m in _BACKTICKED_FILE.finditer(line):
            yield number, "file", m.group(1)


def test_docs_name_only_files_that_exist():
    files = _repository_files()
    folders = {str(p) for f in files for p in pathlib.PurePosixPath(f).parents}
    basenames = {pathlib.PurePosixPath(f).name for f in files}

    def exists(path: str) -> bool:
        path = path.rstrip("/")
        if any(ch in path for ch in "*?["):
            return any(fnmatch.fnmatch(f, path) for f in files)
        # a module named without .py (a test id: `examples/gemma_block`)
        return path in files or path in folders or f"{path}.py" in files

    dangling = []
    for doc in DOCS:
        where = str(doc.relative_to(ROOT))
        for number, what, name in _names_in(doc):
            if name in NOT_REPOSITORY_FILES:
                continue
            if what == "file":
                ok = name in basenames
            elif what == "link":
                ok = exists(os.path.normpath(str(doc.parent.relative_to(ROOT) / name)))
            else:
                ok = all(exists(p) for p in _expand_braces(name))
            if not ok:
                dangling.append(f"{where}:{number}: {name}")
    assert not dangling, "docs name files that do not exist:\n" + "\n".join(dangling)

