"""Step time as a function of a step's shape (engine/step_shape.py), fitted from timed steps.

Several forms compete; each is a non-negative linear model with an intercept over some of
the shape's figures. The form with the smallest median relative error on held-out steps
(every 4th step, never fitted) is chosen (the simplest one unless more terms cut that
error by more than SIMPLER_SLACK), then refitted on all steps; that held-out error
is reported with the profile. Steps without a speculative draft cannot time one: a draft
token is then charged as a prefill token (both are query rows of the forward). A profile also carries what sizes the KV pool (weights, KV
bytes per token, activations per batched token), so the simulator gives each setting the
pool the engine would have, and the identity it was measured under (model, hardware,
torch, threads): a profile from another identity is refused by name.
"""
from __future__ import annotations

import dataclasses

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from engine.step_shape import StepShape

# each form: the shape's figures (besides the intercept) step time is linear in
FORMS: dict[str, tuple[str, ...]] = {
    "tokens": ("num_tokens",),
    "rows": ("prefill_tokens", "decode_seqs", "draft_tokens", "draft_seqs", "lookup_seqs"),
    "attention": ("prefill_tokens", "prefill_attention", "decode_seqs", "decode_context",
                  "draft_tokens", "draft_seqs", "lookup_seqs"),
    "attention+blocks": ("prefill_tokens", "prefill_attention", "prefill_seqs",
                         "decode_seqs", "decode_context", "draft_tokens", "draft_seqs",
                         "lookup_seqs", "blocks_read"),
}
UNFITTED = "unfitted"   # a profile's form before any step was timed (calibrate.config_profile)
HOLDOUT_EVERY = 4
SIMPLER_SLACK = 0.05  # a form with more terms must cut the held-out error by more than 5 %


SERVED_ROWS = "served_rows"  # the serving term's figure: rows a step delivers (serving_term)
SERVED_ROWS_SQUARED = "served_rows_squared"   # its square, counted per step: the cost that grows
SERVED_STEP = "served_step"   # 1 for a step that delivered rows: serving's cost per step


def feature(shape: StepShape | dict, name: str) -> float:
    if name == SERVED_STEP:
        return 1.0 if feature(shape, SERVED_ROWS) else 0.0
    if name == SERVED_ROWS:
        return feature(shape, "decode_seqs") + feature(shape, "prefill_seqs")
    if name == SERVED_ROWS_SQUARED:
        # a step's square, or a window's mean of its steps' squares (the engine counts
        # them); an engine older than that counter leaves 0 where rows were served: the
        # square of the mean rows stands in (low wherever the batch size varied)
        counted = (shape.get(name, 0.0) if isinstance(shape, dict)
                   else shape.served_rows_squared)
        rows = feature(shape, SERVED_ROWS)
        return counted if counted or not rows else rows ** 2
    if isinstance(shape, dict):
        if name == "num_tokens":
            return shape["prefill_tokens"] + shape["decode_seqs"] + shape["draft_tokens"]
        return shape.get(name, 0.0)   # an engine older than a figure never counted it
    return getattr(shape, name)


def design(shapes: list, names: tuple[str, ...]) -> np.ndarray:
    """[steps, 1 + len(names)]: an intercept column, then each figure."""
    x = np.ones((len(shapes), 1 + len(names)))
    for j, name in enumerate(names, start=1):
        x[:, j] = [feature(s, name) for s in shapes]
    return x


def nonnegative_lstsq(x: np.ndarray, y: np.ndarray,
                      weight: np.ndarray | None = None) -> np.ndarray:
    """Least squares of the relative error (each step weighted by 1 / its time: the error
    a form is chosen by, so a 100 ms prefill does not drown the sub-millisecond terms of
    4 ms decodes; or by `weight`) with every coefficient >= 0 (a step never gets faster
    with more work): refit without the most negative coefficient until none is negative.
    Columns are scaled to unit maximum first, so figures of very different sizes fit
    alike."""
    if weight is None:
        weight = 1.0 / np.maximum(np.abs(y), 1e-9)
    x, y = x * weight[:, None], y * weight
    scale = np.abs(x).max(axis=0)
    scale[scale == 0] = 1.0
    xs = x / scale
    active = list(range(x.shape[1]))
    while True:
        coef = np.zeros(x.shape[1])
        if active:
            coef[active] = np.linalg.lstsq(xs[:, active], y, rcond=None)[0]
        negative = [j for j in active if coef[j] < 0]
        if not negative:
            return coef / scale
        active.remove(min(negative, key=lambda j: coef[j]))


def median_relative_error(predicted: np.ndarray, measured: np.ndarray) -> float:
    return float(np.median(np.abs(predicted - measured) / np.maximum(measured, 1e-9)))


@dataclass
class Fit:
    form: str
    coefficients: dict[str, float]   # "intercept" and each figure of the form, seconds
    heldout_error: float             # median |predicted - measured| / measured, held out
    errors: dict[str, float] = field(default_factory=dict)  # every form's held-out error

    def predict(self, shape: StepShape | dict) -> float:
        t = self.coefficients["intercept"]
        for name, c in self.coefficients.items():
            if name != "intercept":
                t += c * feature(shape, name)
        return t


def fit(shapes: list, seconds: list[float], forms: dict[str, tuple[str, ...]] = FORMS) -> Fit:
    """Choose the form by held-out error and fit it on every step."""
    if len(shapes) != len(seconds):
        raise ValueError(f"{len(shapes)} step shapes but {len(seconds)} step times")
    if len(shapes) < 2 * HOLDOUT_EVERY:
        raise ValueError(f"{len(shapes)} timed steps are too few to fit a profile; "
                         f"give at least {2 * HOLDOUT_EVERY}")
    y = np.asarray(seconds, dtype=float)
    held = np.arange(len(y)) % HOLDOUT_EVERY == HOLDOUT_EVERY - 1
    errors = {}
    for name, figures in forms.items():
        x = design(shapes, figures)
        coef = nonnegative_lstsq(x[~held], y[~held])
        errors[name] = median_relative_error(x[held] @ coef, y[held])
    # the simplest form within a hair of the best (more terms only for a real gain)
    floor = min(errors.values()) * (1 + SIMPLER_SLACK) + 1e-3
    best = min((n for n in errors if errors[n] <= floor), key=lambda n: (len(forms[n]), errors[n]))
    x = design(shapes, forms[best])
    coefficients = dict(zip(("intercept",) + forms[best], map(float, nonnegative_lstsq(x, y))))
    return Fit(best, priced_drafts(coefficients), errors[best], errors)


def priced_drafts(coefficients: dict[str, float]) -> dict[str, float]:
    """A draft token is one more query row of the forward, as a prompt token is: it costs
    at least what a prefill token does. Steps that never verified a draft (a calibration,
    a pilot without speculation) cannot time one, and the fit leaves it at 0; a fit may
    also price it lower by leaning on correlated terms. Either makes verification free in
    the simulator: SmolLM2's agentic sweep (2026-12-05) ranked suffix:8 with 54 sequences
    at 1.42x the defaults' simulated capacity and measured it at 0.70x
    [0.53, 0.93]."""
    if "draft_tokens" in coefficients:
        floor = coefficients.get("prefill_tokens", 0.0)
        if coefficients["draft_tokens"] < floor:
            coefficients = {**coefficients, "draft_tokens": floor}
    return coefficients


@dataclass(frozen=True)
class Identity:
    """What a profile holds for: step times differ by model, hardware, torch and threads."""
    model: str        # the model as given (builtin://..., a path)
    fingerprint: str  # hash of the checkpoint's config.json: the same model under any path
    hardware: str
    torch: str
    threads: int

    def key(self) -> str:
        safe = "".join(c if c.isalnum() else "-" for c in self.model).strip("-")[-48:]
        return f"{safe}-{self.fingerprint[:12]}-t{self.threads}-torch{self.torch}"

    def mismatch(self, other: "Identity") -> list[str]:
        return [f"{k} {getattr(self, k)!r} (this run: {getattr(other, k)!r})"
                for k in ("fingerprint", "hardware", "torch", "threads")
                if getattr(self, k) != getattr(other, k)]


@dataclass
class Memory:
    """What sizes the pool: engine/kv_capacity.num_kv_blocks's terms, per setting."""
    device_bytes: float             # a GPU's memory; 0 on CPU (the cpu_memory_gib setting)
    weight_bytes: float
    kv_bytes_per_token: int
    activation_base: float          # activations = base + per_token x max_num_batched_tokens
    activation_per_token: float     #   + per_seq x min(max_num_seqs, max_num_batched_tokens)
    max_model_len: int
    vocab_size: int
    # the host KV tier's copies (tuner/sim/tiers.py), timed on this machine; None: not timed
    # (a profile from before them, or from config.json), and blocks move in no time
    store_seconds_per_byte: float | None = None
    load_seconds_per_byte: float | None = None
    # a disk tier's load, per file byte: the read and the copy into the pool
    disk_load_seconds_per_byte: float | None = None
    # the logits one sampled sequence adds to the engine's profiling forward (it keeps the
    # last token's logits of each of its min(max_num_seqs, max_num_batched_tokens)
    # sequences): vocab x (the model's dtype + the float32 copy); None (a profile from
    # before it): float32 logits, vocab x 4
    activation_per_seq: float | None = None

    def activations(self, *, max_num_batched_tokens: int, max_num_seqs: int) -> float:
        """The activations the engine measures at start with these batch limits."""
        per_seq = self.vocab_size * 4 if self.activation_per_seq is None \
            else self.activation_per_seq
        return (self.activation_base + self.activation_per_token * max_num_batched_tokens
                + per_seq * max(1, min(max_num_seqs, max_num_batched_tokens)))

    def num_blocks(self, *, block_size: int, fraction: float, max_num_batched_tokens: int,
                   max_num_seqs: int, cpu_memory_gib: float) -> int:
        device = self.device_bytes or cpu_memory_gib * 2**30
        activations = self.activations(max_num_batched_tokens=max_num_batched_tokens,
                                       max_num_seqs=max_num_seqs)
        budget = fraction * device - self.weight_bytes - activations
        return int(budget // (block_size * self.kv_bytes_per_token))

    def copies_text(self) -> str:
        """The host KV tier's copy rates as GB/s, or that they are not timed."""
        if not self.load_seconds_per_byte or not self.store_seconds_per_byte:
            return "host KV tier copies not timed (they take no time)"
        disk = (f", disk loads {1e-9 / self.disk_load_seconds_per_byte:.2f} GB/s"
                if self.disk_load_seconds_per_byte else "")
        return (f"host KV tier copies: stores {1e-9 / self.store_seconds_per_byte:.2f} GB/s, "
                f"loads {1e-9 / self.load_seconds_per_byte:.2f} GB/s{disk}")


@dataclass
class Profile:
    identity: Identity
    fit: Fit
    memory: Memory
    num_steps: int
    created: str = ""

    def step_seconds(self, shape: StepShape) -> float:
        return max(self.fit.predict(shape), 1e-6)

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, path: str | Path, *, expect: Identity | None = None) -> "Profile":
        """Read a profile; with `expect`, refuse one measured for another identity."""
        try:
            doc = json.loads(Path(path).read_text())
            fit = Fit(**doc["fit"])   # a profile saved before drafts were priced, too
            fit = dataclasses.replace(fit, coefficients=priced_drafts(fit.coefficients))
            profile = cls(Identity(**doc["identity"]), fit,
                          Memory(**doc["memory"]), doc["num_steps"], doc.get("created", ""))
        except OSError as exc:
            raise ValueError(f"profile {path}: {exc.strerror}") from None
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"profile {path} is not a profile written by `python -m tuner "
                             f"profile` ({exc!r}); make it again with that command") from None
        if expect is not None:
            wrong = profile.identity.mismatch(expect)
            if wrong:
                raise ValueError(
                    f"profile {path} was measured for model {profile.identity.model!r} "
                    f"under other conditions: {'; '.join(wrong)}; run `python -m tuner "
                    f"profile --model {expect.model}` (with the same --threads) for this one")
        if not all(math.isfinite(v) for v in profile.fit.coefficients.values()):
            raise ValueError(f"profile {path} has non-finite coefficients; make it again")
        return profile
