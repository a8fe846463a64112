"""`prepare`: build what the methods need, reproducibly, into the artifact cache.

Steps: (mini only) build the embedded target; teacher trajectories = the target's own greedy
continuations of the train seeds; hidden-state taps; train the DFlash drafter; then every registered
fitter (aux heads and fits of methods 02-14) adds its files. Everything lands in
`$DFLASH_HOME/artifacts/<target key>/` with a manifest of SHA-256, sizes, configs, versions and seeds.
The key is the target's content hash, so a copied checkpoint finds the same artifacts. prepare holds the
home's lock while it runs (readers wait for it), logs its progress through `logging` ("dflash_core.*"
loggers, timestamped), and leaves the caller's torch thread count as it found it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import random
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import ArtifactError, BadInputError
from ..methods import FitContext, fit_files, fitters
from ..methods.support.fitting import fit_deadline
from ..options import TEACHER_DTYPE_CHOICES, env_value, option
from ..progress import ensure_console_logging
from ..runtime.allocator import trim_free_memory
from ..runtime.device import check_device_name, torch_threads
from ..runtime.drafter import DrafterConfig, default_taps, parameter_count
from ..runtime.numerics import numerics_record
from ..runtime.precision import bf16_linear_weights, train_in_bf16
from ..runtime.target import PADDED_MODEL_TYPES, load_target, pads_exactly
from ..store.artifacts import (
    TARGET_MANIFEST,
    check_inside_home,
    file_entry,
    home_lock,
    mini_target_dir,
    read_manifest,
    target_identity,
    tensor_bytes,
    verify_target_files,
    write_atomic,
    write_json_atomic,
    write_manifest,
    write_target_manifest,
)
from ..store.data import load_prompts, shipped_held_out
from ..store.heldout import NO_TEXT_REASON, UNIT_RULE, check_clean, decoder_of, filter_clean
from . import distributed as dist
from .devices import DevicePlan, plan_device, runtime_on
from .drafter_format import drafter_digest, load_hf_drafter, mask_token_for, resolve_drafter_source
from .minitarget import MiniTargetConfig, build_mini_target, check_corpus, corpus_texts
from .minitarget import corpus_files as corpus_paths
from .prepared import DRAFTER_FILE, Prepared, load_prepared, prepared_dir  # noqa: F401  (re-exported: callers import them here)
from .reference import import_reference, is_reference_build, reference_bundle
from .reuse import copy_artifacts, reusable_trajectories, same_as_own, teacher_key
from .teacher import FORCED_BATCH, PADDED_BATCH, TeacherData, forced_data, save_teacher, teacher_data
from .timebudget import (
    PROBE_SEEDS,
    check_budget_floor,
    check_teacher_probe,
    fits_deadline,
    generation_allowance,
    plan_training,
    resolve_prepare_budget,
    sized_generation,
    teacher_plan_line,
)
from .train import (
    LARGE_VOCAB,
    TrainConfig,
    check_train_knobs,
    resolve_schedule,
    resolve_seed_labels,
    resolve_select,
    train_config_dict,
    train_drafter,
)
from .traindata import TrainText, _digest, cut_seeds, forced_chunks, forced_lines, load_train_text

TRAJ_FILE = "trajectories.json"
# What prepare builds for a given config. Bump it whenever the recipe or PrepareConfig's defaults change
# (tests/prepare/test_prepare.py pins the defaults to DEFAULTS_SHA256), so homes built by an older prepare are rebuilt.
RECIPE = ("2026-12-03b: taps from the teacher pass, chunked exact loss, bf16 matmuls and sampled head rows at "
          "vocab >= 16384, shipped training text for every target (issue 29); at vocab >= 16384 a draft vocabulary "
          "(8192 to 16384 ids), teacher-forced text and 3000 steps under a 15-minute budget with patience 20 "
          "(issue 39)")
DEFAULTS_SHA256 = "e384317c8563d209d6772d8fe39aba0166d1bcb302bc562066b215ce028e4880"


@dataclass(frozen=True)
class PrepareConfig:
    family: str | None = None  # prompt family; None: the checkpoint's own (mini: 'code'), else 'english'
    traj_tokens: int = 64
    corpus_seeds: int = 2368  # extra train seeds cut from the mini target's corpus (mini only); teacher
    # generation is batched by prompt length, so 2400 seeds x 64 tokens cost about what 224 cost one at a time
    random_seeds: int = 0  # tokenizer-less targets: seeded random id prompts
    n_taps: int = 3
    block_size: int = 16  # studies/2026-11-30-drafter-variants/: block 16 beats block 8 in the real decode on this CPU
    drafter_layers: int = 1
    drafter_heads: int = 4
    drafter_intermediate: int | None = None  # None: 2 x target hidden
    anchor_embed: bool = False  # the anchor's embedding on the MASK rows (DrafterConfig.anchor_embed): a small
    # measured gain on SmolLM2 (docs/real-targets.md), off by default: transformers' DFlash drafter cannot hold it, so
    # such a drafter has no export and no dflash_transformers row
    forced_tokens: int | str = "auto"  # teacher-forced target passes over training text (`teacher.forced_data`), in
    # tokens: auto = FORCED_TOKENS at a real vocabulary (>= train.LARGE_VOCAB), 0 elsewhere (the mini's recipe)
    forced_length: int = 128  # tokens per teacher-forced chunk
    teacher_dtype: str = "auto"  # the teacher passes' matmuls (`teacher_autocast`, --teacher-dtype): 'auto' is
    # 'bfloat16' at a real vocabulary where the lab's bf16 rule allows it (2.1-2.3x float32's speed at the 350M shape
    # on AMX and AVX512-BF16 CPUs, 1.2x on SmolLM2) and 'float32' elsewhere (the mini target: its recipe unchanged);
    # its labels leave float32 greedy at near-ties, which cost no measured acceptance (docs/real-targets.md)
    teacher_batching: str = "auto"  # how the teacher groups its prompts: 'length' (one length a batch, no padding)
    # or 'padded' (mixed lengths left-padded, `teacher.padded_batches`); 'auto' is 'padded' at a real vocabulary
    # where the model type pads exactly (`target.pads_exactly`: the shipped seeds' lengths spread over ~30 values,
    # so length buckets make many small batches) and 'length' elsewhere (the mini target: its recipe unchanged)
    budget_minutes: float | str | None = "auto"  # --prepare-budget: minutes the whole prepare may take; training
    # gets what the teacher, the projected fits and a safety share leave (`timebudget`); auto: 30 at a real
    # vocabulary, none for the mini target; None: no budget (the training budget and steps alone decide)
    train_data: str | None = None  # --train-data: where train seeds are cut from (None: the family's shipped corpus)
    train: TrainConfig = field(default_factory=TrainConfig)
    aux_steps: int = 300  # optimisation steps for each method head fitted after the drafter
    aux_max_examples: int | None = None  # cap on draft examples used by the fits (None: all)
    threads: int = 2
    seed: int = 7
    device: str = "cpu"  # --device: where the teacher passes and drafter training run (`devices`); 'cpu' is the
    # recipe every home and the reference bundle were built with

    def to_dict(self) -> dict:
        d = asdict(self)
        for k, defaults in LATE_KNOBS.items():  # at their defaults they build what configs recorded before them
            if d[k] in defaults:  # built: left out
                del d[k]
        d["train"] = train_config_dict(self.train)  # the same rule for TrainConfig's late knobs
        return d


# Knobs added after homes and the reference bundle were built, whose defaults build what was built before them: at
# their defaults a config writes (and compares as) the dict it wrote before they existed, so homes and the shipped
# bundle stay current; set, they are recorded and compared. teacher_dtype has two: 'auto' (an unresolved config:
# prepare records the resolved dtype) and 'float32' (what 'auto' resolves to for the mini target, and what every home
# was built with before the knob); teacher_batching likewise ('length' is what every home was built with before it).
LATE_KNOBS = {"anchor_embed": (False,), "teacher_dtype": ("auto", "float32"), "teacher_batching": ("auto", "length"),
              "budget_minutes": ("auto",), "device": ("cpu",)}


FORCED_TOKENS = 262144  # the auto budget of teacher-forced text at a real vocabulary (~1.8 GB of taps at 135M)

log = logging.getLogger(__name__)


def forced_token_budget(cfg: PrepareConfig, vocab: int) -> int:
    v = cfg.forced_tokens
    if v == "auto":
        return FORCED_TOKENS if vocab >= LARGE_VOCAB else 0
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise BadInputError(f"forced_tokens must be 'auto' or an integer >= 0, got {v!r}")
    return v


TEACHER_DTYPES = TEACHER_DTYPE_CHOICES


def check_teacher_dtype(v) -> None:
    if not isinstance(v, str) or v not in TEACHER_DTYPES:
        raise BadInputError(f"teacher_dtype must be one of {', '.join(TEACHER_DTYPES)}, got {str(v)[:40]!r}")


def refuse_emulated_teacher(v: str, device: str) -> None:
    """The one refusal of bf16 teacher passes where torch would emulate bf16 (the lab's bf16 rule), for prepare's
    early check, `resolve_teacher_dtype` and the scripts that build teacher sets."""
    if v == "bfloat16" and not train_in_bf16(device):
        raise BadInputError(f"teacher_dtype 'bfloat16' on {device}, which has no native bf16 (torch would emulate it "
                            "~60x slower): use teacher_dtype 'float32' (--teacher-dtype float32)")


def resolve_auto_teacher(value: str, rt) -> str:
    """PrepareConfig.teacher_dtype with 'auto' resolved for this target: 'bfloat16' at a real vocabulary (>= the
    drafter recipe's LARGE_VOCAB) for a float32 target on a device with native bf16, else 'float32' (the mini
    target, a CPU that would emulate bf16, a target loaded in another dtype); any other value as given."""
    check_teacher_dtype(value)
    if value != "auto":
        return value
    import torch

    native = rt.dtype == torch.float32 and train_in_bf16(str(rt.device))
    return "bfloat16" if native and rt.vocab_size >= LARGE_VOCAB else "float32"


TEACHER_BATCHINGS = ("auto", "length", "padded")


def check_teacher_batching(value) -> None:
    if not isinstance(value, str) or value not in TEACHER_BATCHINGS:
        raise BadInputError(f"teacher_batching must be one of {', '.join(TEACHER_BATCHINGS)}, got {str(value)[:40]!r}")


def resolve_teacher_batching(value, rt) -> str:
    """PrepareConfig.teacher_batching resolved for this target: 'auto' is 'padded' at a real vocabulary (>=
    LARGE_VOCAB) where the model type pads exactly, else 'length'; 'padded' asked of a model type that does not is
    refused (its padding could leak into real rows)."""
    check_teacher_batching(value)
    if value == "auto":
        return "padded" if rt.vocab_size >= LARGE_VOCAB and pads_exactly(rt) else "length"
    if value == "padded" and not pads_exactly(rt):
        raise BadInputError(f"teacher_batching 'padded' needs a target of model type {', '.join(PADDED_MODEL_TYPES)}; "
                            "use teacher_batching 'length'")
    return value


def resolve_teacher_dtype(cfg: PrepareConfig, rt) -> str:
    """The teacher passes' matmul dtype: 'bfloat16' only where the lab's bf16 rule allows it (runtime/precision.py:
    native bf16), else refused; a float64 target keeps its dtype. Its trajectories and labels are then the bf16
    target's greedy tokens, which the float32 decode's differ from at near-ties (training data, not a decode under
    test): 64 % of SmolLM2's 64-token trajectories differ from float32's somewhere, and drafters trained on them
    accept as many float32 tokens as float32-trained ones (docs/real-targets.md, "A bf16 teacher")."""
    v = resolve_auto_teacher(cfg.teacher_dtype, rt)
    import torch

    if rt.dtype != torch.float32:
        return str(rt.dtype).replace("torch.", "")
    refuse_emulated_teacher(v, str(rt.device))
    return v


@contextlib.contextmanager
def teacher_autocast(rt, dtype: str):
    """bf16 autocast of the target's matmuls for the teacher passes (the residual stream stays float32, so the
    taps are float32 values); nothing for float32. The Linear weights are cast to bf16 once for the whole pass
    (`bf16_linear_weights`: the same numbers as autocast's own per-forward casts, which cost 41 % of a 350M
    teacher step) and are float32 again afterwards."""
    import torch

    if dtype != "bfloat16":
        yield
        return
    model = getattr(rt, "model", None)
    with torch.autocast(torch.device(rt.device).type, dtype=torch.bfloat16), \
            (bf16_linear_weights(model) if model is not None else contextlib.nullcontext()):
        yield


def check_anchor_embed(v) -> None:
    if not isinstance(v, bool):
        raise BadInputError(f"anchor_embed must be true or false, got {str(v)[:40]!r}")


def forced_teacher(rt, cfg: PrepareConfig, family: str, seeds, taps, progress: bool, batch: int | None = None,
                   seconds: float | None = None):
    """Teacher-forced passes over the training text's lines that no seed was cut from (held-out checked), up to
    the token budget; (TeacherData or None, manifest record). `seconds`: the time the prepare budget leaves them
    (None: no limit); the text is then run in chunks, the first timed, while that time lasts."""
    budget = forced_token_budget(cfg, rt.vocab_size)
    if not budget or rt.tokenizer is None:
        return None, {"tokens": 0}
    if seconds is not None and seconds <= 0:
        _log("teacher-forced text: none (the teacher spent the prepare budget's share for teacher data)")
        return None, {"tokens": 0, "budget": budget, "why": "the teacher spent the prepare budget's generation share"}
    t0 = time.perf_counter()
    lines, rec = forced_lines(load_train_text(cfg.train_data, family), [rt.decode(list(s)) for s in seeds])
    chunks = forced_chunks(rt.tokenizer, lines, budget, cfg.forced_length)
    if not chunks:
        return None, {**rec, "tokens": 0}
    dtype = resolve_teacher_dtype(cfg, rt)
    batch = batch or FORCED_BATCH
    with teacher_autocast(rt, dtype):
        if seconds is None:
            data = forced_data(rt, chunks, taps, batch=batch, progress=progress)
        else:  # in text order, while the budget's share lasts (`timebudget.sized_generation`)
            got = sized_generation(lambda idx: forced_data(rt, [chunks[i] for i in idx], taps, batch=batch),
                                   len(chunks), seconds, first=batch, agree=dist.broadcast_object)
            data = functools.reduce(TeacherData.extend, got.parts)
            chunks = chunks[:len(got.kept)]
            rec["sized"] = got.record
    rec.update({"chunks": len(chunks), "tokens": sum(map(len, chunks)), "budget": budget, "dtype": dtype,
                "seconds": time.perf_counter() - t0})
    _log(f"teacher-forced text: {rec['tokens']} tokens in {len(chunks)} chunks in {rec['seconds']:.1f}s")
    return data, rec


def _log(msg: str) -> None:
    log.info(msg)


def family_for(rt, cfg: PrepareConfig) -> str:
    """The prompt family: asked for, else what the checkpoint says about itself (mini_target_meta.json), else
    'english'. Never inferred from the target's name or folder."""
    if cfg.family:
        return cfg.family
    return getattr(rt, "info", {}).get("family") or "english"


def train_seed_ids(rt, cfg: PrepareConfig, family: str, record: dict | None = None) -> list[list[int]]:
    """Encoded train seeds: the family's seeds, then `corpus_seeds` cut from the training text; tokenizer-less
    targets get seeded random ids. `record` (optional) receives the training text's provenance.

    Held-out guard (`heldout`): the family's seeds are refused if one shares an n-gram with a benchmark or
    calibration prompt. The training text is `traindata.load_train_text(cfg.train_data, family)`: for the mini
    target without --train-data that is its own corpus, checked whole first (refused if it leaks: a target that
    memorised a held-out prompt cannot be fixed by dropping seeds) and cut by lines as before; any other text is
    cut into line and sentence starts, and the ones that leak are dropped and counted.
    """
    if rt.tokenizer is None:
        r = random.Random(cfg.seed)
        n = max(cfg.random_seeds, 8)
        return [[r.randrange(3, rt.vocab_size) for _ in range(r.randrange(2, 12))] for _ in range(n)]
    held = shipped_held_out()
    ps = load_prompts(family)
    texts = list(ps.train)
    check_clean(texts, held, f"the {family!r} train seeds", names=[repr(t) for t in texts],
                fix="remove or change that train seed in data/prompts.json")
    corpus_files = getattr(rt, "info", {}).get("mini_corpus_files")  # set when the checkpoint is a mini target
    if corpus_files and not cfg.train_data:
        mcfg = MiniTargetConfig(corpus_files=corpus_files)
        corpus = corpus_texts(mcfg)
        check_corpus(corpus, [p.name for p in corpus_paths(mcfg)])
        if record is not None:
            names = [p.name for p in corpus_paths(mcfg)]
            record.update(TrainText("shipped:mini-corpus", "shipped", corpus, names, _digest(corpus, names)).record())
        if cfg.corpus_seeds:
            lines = [ln.rstrip() for t in corpus for ln in t.splitlines()]
            lines = [ln for ln in lines if 12 <= len(ln.strip()) <= 80]
            r = random.Random(cfg.seed)
            cut = r.sample(lines, min(cfg.corpus_seeds, len(lines)))
            check_clean(cut, held, "the train seeds cut from the corpus", names=[repr(t) for t in cut])
            texts += cut
    elif cfg.corpus_seeds:
        tt = load_train_text(cfg.train_data, family)
        cut, info = cut_seeds(tt, cfg.corpus_seeds, cfg.seed)
        check_clean(cut, held, "the train seeds cut from the training text", names=[repr(t) for t in cut])
        texts += cut
        if record is not None:
            record.update({**tt.record(), **info})
    return [rt.encode(t) for t in texts]


def drop_leaking_trajectories(rt, trajs: list[list[int]], seeds: list[list[int]]):
    """Teacher trajectories are generated text: one that shares an n-gram with a held-out prompt is dropped
    (with its seed) before anything trains on it. Returns (trajectories, seeds, held-out record)."""
    held = shipped_held_out()
    record: dict[str, Any] = {"rule": UNIT_RULE, "held_out_ngrams": len(held.grams)}
    decode = decoder_of(rt)
    if decode is None:
        _log(f"held-out check of the teacher trajectories skipped: {NO_TEXT_REASON}")
        return trajs, seeds, {**record, "trajectories_checked": False, "why_unchecked": NO_TEXT_REASON}
    keep, drop = filter_clean([decode(t) for t in trajs], held)
    if drop:
        log.warning("dropped %d of %d teacher trajectories that share an n-gram with a held-out prompt (%s)",
                    len(drop), len(trajs), drop[:8])
    if not keep:
        raise BadInputError("every teacher trajectory shares an n-gram with a held-out prompt: choose other train "
                            "seeds or held-out prompts (data/prompts.json)")
    record.update({"trajectories_checked": True, "trajectories_generated": len(trajs),
                   "trajectories_dropped": len(drop), "dropped_indexes": drop,
                   "corpus_checked": bool(getattr(rt, "info", {}).get("mini_corpus_files"))})
    return [trajs[i] for i in keep], [seeds[i] for i in keep], record


def ensure_target(target: str, home, refresh: bool, progress: bool) -> None:
    if target != "mini":
        return
    d = mini_target_dir(home)
    check_inside_home(d, home)  # the mini target is built or imported here
    # --rebuild-mini replaces the imported reference once; a target built here is kept (the flag stays idempotent)
    local = env_value("rebuild_mini") and env_value("mini_seed") is None
    if (d / "config.json").is_file() and not refresh and not (local and is_reference_build(d)):
        if not (d / TARGET_MANIFEST).is_file():
            _log(f"recording {TARGET_MANIFEST} for the mini target in {d} (built before target manifests existed)")
            write_target_manifest(d)
            return
        try:
            verify_target_files(d, "rebuilding it")
            return
        except ArtifactError as exc:
            log.warning("the mini target is damaged, rebuilding it: %s", exc)
    seed = env_value("mini_seed")
    if seed is None and not env_value("rebuild_mini") and reference_bundle() is not None:
        # the standard mini target is the shipped reference build, the same on every machine (prepare/reference.py)
        _log(f"importing the shipped reference mini target and its artifacts from {reference_bundle()} (every file "
             "checked by SHA-256 and size; --rebuild-mini builds one locally instead)")
        got = import_reference(home)
        _log(f"reference mini target installed in {got['target_dir']} (artifacts {Path(got['artifact_dir']).name})")
        return
    cfg = MiniTargetConfig() if seed is None else MiniTargetConfig(seed=int(seed))
    _log(f"building the embedded mini target (training seed {cfg.seed}) into {d} (a few minutes on 2 cores)")
    build_mini_target(d, cfg, progress=progress)


def prepare(target: str = "mini", *, home=None, refresh: bool = False, progress: bool = True,
            cfg: PrepareConfig | None = None, rt=None, threads: int | None = None,
            drafter: str | None = None, train_data: str | None = None,
            train_budget: float | str | None = None, train_seeds: int | None = None,
            teacher_dtype: str | None = None, prepare_budget: float | str | None = None,
            device: str | None = None) -> Path:
    """Build (or verify) every artifact for `target`; returns the artifact directory.

    With `cfg`, present artifacts are reused only when they were built with that config; without it (bench,
    run, the CLI), whatever config the home was prepared with is reused, as long as it was built by this
    RECIPE (a home prepared on purpose with a custom config is not silently rebuilt at the defaults).
    `threads` overrides cfg.threads (the torch intra-op threads prepare trains with; recorded, not compared:
    on this lab's CPU kind the mini build gave identical weights with 1 and 2 threads, docs/mini-target.md).
    The caller's own torch thread count is restored afterwards.
    `drafter`: a transformers-format DFlash drafter (directory or hub id) used instead of training one; its
    artifacts (every fitter runs on it) go to their own directory, keyed by the drafter's content hash.
    `train_data` (--train-data) and `train_budget` (--train-budget, minutes, or 'off': the steps alone decide)
    override cfg.train_data and cfg.train.budget_minutes; artifacts built from other training text (by content
    hash) are rebuilt. `train_seeds` (--train-seeds) overrides cfg.corpus_seeds, the teacher data's size; artifacts
    built with another count are rebuilt even where the home's recorded config is otherwise accepted.
    `teacher_dtype` (--teacher-dtype) overrides cfg.teacher_dtype the same way (compared even where the recorded
    config is accepted): bfloat16 only where the CPU computes it natively, refused before the target is loaded.
    `prepare_budget` (--prepare-budget, minutes, 'auto' or 'off') overrides cfg.budget_minutes: the whole run's
    time, training capped at what the steps before it and the projected fits leave (`timebudget`).
    `device` (--device: cpu, cuda, cuda:N) overrides cfg.device: where the target's teacher passes and the drafter's
    training run (`devices.DevicePlan`: batch sizes, the process group's backend, recorded in the manifest); a GPU
    device given on purpose is compared like --train-seeds. Refused before any work where this machine lacks it.
    Holds the home's lock throughout: a second prepare or a reader waits instead of racing a rebuild.
    Under torchrun (WORLD_SIZE > 1) every rank runs this: teacher generation is sharded, training is DDP,
    and rank 0 alone holds the lock and writes (`distributed`).
    """
    accept_recorded = cfg is None
    cfg = cfg or PrepareConfig()
    # the Python API's knobs, checked by the option table's own rules (`options.Option.check`), as the CLI's are
    threads, train_seeds = option("threads").check(threads), option("train_seeds").check(train_seeds)
    train_budget = option("train_budget").check(train_budget)
    prepare_budget = option("prepare_budget").check(prepare_budget)
    if threads is not None:
        cfg = replace(cfg, threads=threads)
    # refused here, not after a teacher pass of minutes
    check_train_knobs(cfg.train)
    check_anchor_embed(cfg.anchor_embed)
    check_teacher_dtype(cfg.teacher_dtype)
    check_teacher_batching(cfg.teacher_batching)
    if train_data is not None:
        cfg = replace(cfg, train_data=str(train_data))
    pinned: tuple[str, ...] = ()  # knobs given on this run: compared even where the recorded config is accepted
    if train_seeds is not None:
        cfg, pinned = replace(cfg, corpus_seeds=train_seeds), ("corpus_seeds",)
    if device is not None:
        check_device_name(device)
        cfg = replace(cfg, device=device)
        pinned += ("device",) if device != "cpu" else ()
    elif rt is not None and rt.device.type != "cpu":  # a caller's runtime already on a GPU: record where it ran
        cfg = replace(cfg, device=str(rt.device))
    plan = plan_device(cfg.device)  # refused here when this machine lacks the device
    if teacher_dtype is not None:
        check_teacher_dtype(teacher_dtype)  # both refused before the target is loaded
        refuse_emulated_teacher(teacher_dtype, plan.device)
        cfg, pinned = replace(cfg, teacher_dtype=teacher_dtype), pinned + ("teacher_dtype",)
    if train_budget is not None:
        cfg = replace(cfg, train=replace(cfg.train, budget_minutes=None if train_budget == "off" else train_budget))
    if prepare_budget is not None:
        cfg = replace(cfg, budget_minutes=None if prepare_budget == "off" else prepare_budget)
    if (asked := resolve_prepare_budget(cfg.budget_minutes, LARGE_VOCAB)) is not None:  # refused here when it is not
        check_budget_floor(asked)  # a budget, or one no prepare fits in
    ensure_console_logging()
    dist.init_from_env(plan.device)
    with torch_threads(dist.threads_per_rank(cfg.threads)), home_lock(home, wait_message="another prepare is running"):
        return _prepare(target, home=home, refresh=refresh, progress=progress, cfg=cfg, rt=rt,
                        accept_recorded=accept_recorded, drafter=drafter, pinned=pinned, plan=plan)


def work_dir(out: Path, cfg: PrepareConfig) -> Path:
    """Where a run keeps what a killed prepare resumes from (teacher data, training checkpoints): beside the
    artifacts, keyed by the artifact directory, the recipe and the config, removed when the run completes."""
    doc = json.dumps({"recipe": RECIPE, "cfg": {k: v for k, v in cfg.to_dict().items() if k != "threads"}},
                     sort_keys=True, default=str)
    return out.parent.parent / "work" / f"{out.name}-{hashlib.sha256(doc.encode()).hexdigest()[:12]}"


def config_mismatch(doc: dict, cfg: PrepareConfig, accept_recorded: bool = False,
                    pinned: tuple[str, ...] = ()) -> str | None:
    """Why a manifest's artifacts are not what `cfg` asks for (None when they are): another RECIPE, or (unless
    `accept_recorded`) other settings; the `pinned` settings are compared either way. `threads` is recorded but not
    compared (see `prepare`)."""
    if doc.get("recipe") != RECIPE:
        return f"built by another prepare recipe ({doc.get('recipe')!r} != {RECIPE!r})"
    want = {k: v for k, v in json.loads(json.dumps(cfg.to_dict())).items() if k != "threads"}
    have = doc.get("prepare_config")
    if not isinstance(have, dict):
        return "the manifest records no prepare config"
    have = {k: v for k, v in have.items() if k != "threads"}
    diff = sorted(k for k in set(want) | set(have) if want.get(k) != have.get(k))
    if accept_recorded:
        diff = [k for k in diff if k in pinned]
    if not diff:
        return None
    return "built with another prepare config (" + ", ".join(
        f"{k}: {have.get(k)!r} != {want.get(k)!r}" for k in diff[:4]) + ")"


def present_and_verified(out: Path, ident: dict, required: tuple[str, ...], cfg: PrepareConfig,
                         accept_recorded: bool, source_sha: str | None, train_sha: str | None = None,
                         pinned: tuple[str, ...] = ()) -> bool:
    """`out` holds every required file, verified against its manifest, built by this recipe (and config), from
    that training text (by SHA-256, `--train-data`) and for an imported drafter from that very drafter: a
    repeated prepare has nothing to do."""
    try:
        doc = read_manifest(out, ident, required=required)
        why = config_mismatch(doc, cfg, accept_recorded, pinned)
        if not why and source_sha is not None and (doc.get("drafter") or {}).get("source_sha256") != source_sha:
            why = "built from another drafter"
        if not why and train_sha is not None and (doc.get("train_data") or {}).get("sha256") != train_sha:
            why = "built from other training text (its SHA-256 differs from --train-data's)"
        if why:
            raise ArtifactError(f"{out / 'manifest.json'} was {why}")
        return True
    except ArtifactError as exc:
        if (out / "manifest.json").exists():
            _log(f"rebuilding: {exc}")
        return False


def adopt_own(doc: dict, own: Path, out: Path, ident: dict, drafter: str, source_sha: str, t_start: float) -> Path:
    """An imported drafter identical to the home's own (`reuse.same_as_own`): its artifacts are the own ones, so
    they are copied (verified) instead of refitting every method on the same weights."""
    files = copy_artifacts(own, out, sorted(doc["files"]))
    extra = {k: doc[k] for k in ("recipe", "prepare_config", "seeds", "teacher", "fits", "held_out") if k in doc}
    extra["drafter"] = {**(doc.get("drafter") or {}), "imported": True, "source": str(drafter),
                        "source_sha256": source_sha, "drafter_sha256": doc["drafter_sha256"]}
    extra["reused"] = {"from": str(own), "why": "the imported drafter's config and weights equal the home's own "
                       "drafter (same SHA-256), so every fit is the same"}
    extra["prepare_seconds"] = time.perf_counter() - t_start
    write_manifest(out, ident, files, extra)
    _log(f"the drafter {drafter} is the home's own (sha256 {doc['drafter_sha256'][:12]}): reused its artifacts "
         f"from {own} -> {out}")
    return out


@dataclass
class PrepareRun:
    """One prepare run as its stages see it: each stage reads what the ones before it found and adds its part, so
    `_prepare` reads as the list of stages and a new knob touches the stage that uses it."""

    target: str
    home: Any
    cfg: PrepareConfig
    plan: DevicePlan
    progress: bool
    accept_recorded: bool
    pinned: tuple[str, ...]
    drafter_source: str | None  # --drafter: a transformers-format drafter used instead of training one
    t_start: float = field(default_factory=time.perf_counter)
    rt: Any = None
    ident: dict = field(default_factory=dict)
    family: str = ""
    imported: Any = None  # the --drafter's DFlashDrafter, loaded and checked against the target
    source_sha: str | None = None
    train_sha: str | None = None
    out: Path | None = None  # the artifact directory this run fills
    own: Path | None = None  # the target's own artifacts (trained drafter): what an import may reuse
    work: Path | None = None
    budget_minutes: float | None = None  # --prepare-budget resolved for this target (None: no budget)
    seeds: list[list[int]] = field(default_factory=list)
    taps: tuple[int, ...] = ()
    teacher_dtype: str = "float32"
    key: str = ""
    train_record: dict = field(default_factory=dict)
    teacher: TeacherData | None = None
    teacher_seconds: float = 0.0
    teacher_reused: bool = False
    teacher_sizing: dict | None = None
    held_record: dict = field(default_factory=dict)
    forced: TeacherData | None = None
    forced_record: dict = field(default_factory=lambda: {"tokens": 0})
    budget_record: dict = field(default_factory=dict)
    drafter: Any = None
    metrics: dict = field(default_factory=dict)
    files: dict = field(default_factory=dict)
    fits: dict = field(default_factory=dict)
    fit_seconds: float = 0.0
    trajs: list[list[int]] = field(default_factory=list)

    @property
    def lead(self) -> bool:
        return dist.rank() == 0

    @property
    def top_k(self) -> int:
        return self.cfg.train.distill_top_k if self.imported is None else 0

    @property
    def prompt_lens(self) -> list[int]:
        return [len(s) for s in self.seeds]


def _prepare(target: str, *, home, refresh: bool, progress: bool, cfg: PrepareConfig, rt,
             accept_recorded: bool = False, drafter: str | None = None, pinned: tuple[str, ...] = (),
             plan: DevicePlan | None = None) -> Path:
    """The stages of one prepare, in order; every rank of a torchrun group runs them (rank 0 alone writes)."""
    run = PrepareRun(target, home, cfg, plan or plan_device("cpu"), progress, accept_recorded, pinned, drafter)
    open_target(run, rt, refresh)
    if already_built(run, refresh):
        return run.out
    plan_seeds(run)
    generate_teacher(run, refresh)
    force_text(run)
    obtain_drafter(run)
    # The fits read the trajectories' tokens only: drop the taps (and top-k) before they build their examples,
    # so the two never share the peak (at 350M: 187,818 rows x 3 taps x 1,024 float32 = 2.3 GB, 2.6 with forced text).
    run.teacher = run.forced = None
    trim_free_memory()  # the taps' pages back to the system before the fits allocate theirs (runtime/allocator.py)
    if not run.lead:  # rank 0 fits the methods and writes; the others wait for the artifacts to be complete
        dist.barrier()
        return run.out
    write_drafter(run)
    fit_methods(run)
    write_run_manifest(run)
    shutil.rmtree(run.work, ignore_errors=True)  # complete: nothing left to resume
    dist.barrier()
    _log(f"done in {time.perf_counter() - run.t_start:.1f}s -> {run.out}")
    return run.out


def open_target(run: PrepareRun, rt, refresh: bool) -> None:
    """Load the target (building or importing the mini first), resolve the config's 'auto' knobs for it, load and
    check an imported drafter, and find where the artifacts go: everything refused here is refused before any work."""
    if rt is None:
        if run.lead:
            ensure_target(run.target, run.home, refresh, run.progress)
        dist.barrier()  # the other ranks load the mini target once rank 0 has built it
        rt = load_target(run.target, run.plan.device, "float32", home=run.home)
    run.rt, run.ident = rt, target_identity(rt)
    cfg = run.cfg
    # the selection rule resolved for this target before any config is compared or recorded: a real target's
    # manifest names it, the mini's records what it always did (train.LATE_TRAIN_KNOBS)
    run.cfg = replace(cfg, train=replace(cfg.train, select=resolve_select(cfg.train.select, rt.vocab_size),
                                         seed_labels=resolve_seed_labels(cfg.train.seed_labels, rt.vocab_size)),
                      teacher_dtype=resolve_auto_teacher(cfg.teacher_dtype, rt),  # the same for the teacher's dtype
                      teacher_batching=resolve_teacher_batching(cfg.teacher_batching, rt))  # and its batches
    if run.drafter_source:
        source = resolve_drafter_source(run.drafter_source)
        run.source_sha = drafter_digest(source)
        run.imported = load_hf_drafter(source, rt, run.ident)  # a drafter made for another target: refused here
    run.out = prepared_dir(run.ident, run.home, run.source_sha)
    run.own = prepared_dir(run.ident, run.home)
    run.work = work_dir(run.out, run.cfg)
    for folder in (run.out, run.work):  # every folder this run writes into, before anything is written
        check_inside_home(folder, run.home)
    run.family = family_for(rt, run.cfg)
    if run.cfg.train_data and rt.tokenizer is not None:  # refused here, before any work, when unusable
        run.train_sha = load_train_text(run.cfg.train_data, run.family).sha256
    run.budget_minutes = None if run.imported is not None else resolve_prepare_budget(
        run.cfg.budget_minutes, rt.vocab_size, train_budget_off=run.cfg.train.budget_minutes is None)


def already_built(run: PrepareRun, refresh: bool) -> bool:
    """Whether the artifacts are there already: present and verified, or (an imported drafter equal to the home's
    own) adopted from the own ones. Rank 0 decides (it alone reads the home under the lock); all ranks follow."""
    done = None
    if not refresh and run.lead:
        required = (DRAFTER_FILE, TRAJ_FILE, *fit_files())
        if present_and_verified(run.out, run.ident, required, run.cfg, run.accept_recorded, run.source_sha,
                                run.train_sha, run.pinned):
            done = "present"
        elif run.imported is not None:
            doc = same_as_own(run.imported, run.own, run.ident, required, log)
            if doc is not None and not config_mismatch(doc, run.cfg, run.accept_recorded, run.pinned):
                adopt_own(doc, run.own, run.out, run.ident, run.drafter_source, run.source_sha, run.t_start)
                done = "adopted"
    done = dist.broadcast_object(done)
    if done == "present":
        _log(f"artifacts for {run.rt.name} are present and verified in {run.out}")
    return done is not None


def plan_seeds(run: PrepareRun) -> None:
    """The train seeds, the taps and the teacher's key (what a resumed or reused teacher set must match)."""
    import torch

    rt, cfg = run.rt, run.cfg
    torch.manual_seed(cfg.seed)
    run.seeds = train_seed_ids(rt, cfg, run.family, run.train_record)
    run.taps = default_taps(rt.num_layers, min(cfg.n_taps, rt.num_layers))
    run.teacher_dtype = resolve_teacher_dtype(cfg, rt)
    padded = cfg.teacher_batching == "padded"  # resolved in open_target
    run.key = teacher_key(run.ident, RECIPE, cfg.traj_tokens, run.seeds,
                          f"{rt.dtype}/{getattr(rt, 'kernels', 'eager')}"
                          + ("" if run.teacher_dtype == "float32" else f"/teacher {run.teacher_dtype}")
                          + ("/padded" if padded else "") + ("" if run.plan.on_cpu else f"/{run.plan.device}"))


def generate_teacher(run: PrepareRun, refresh: bool) -> None:
    """The teacher trajectories: reused from the target's own artifacts where an imported drafter needs only them
    and they are exactly what this run would generate (same teacher key); else generated, sized to the prepare
    budget where there is one, and held-out checked. Training our own drafter needs the taps and top-k captured in
    the generating forwards, so it always generates (resuming from the work folder after a kill)."""
    rt, cfg = run.rt, run.cfg
    found = None
    if run.imported is not None and not refresh:
        found = reusable_trajectories(run.own, run.ident, run.key, recipe=RECIPE, seeds=run.seeds,
                                      traj_tokens=cfg.traj_tokens, log=log)
    if found is not None:
        reused, run.seeds, run.held_record = found
        run.teacher = TeacherData([list(x) for x in reused], [len(x) for x in run.seeds])
        run.trajs, run.teacher_reused = run.teacher.sequences, True
        _log(f"teacher trajectories: reusing the {len(run.trajs)} in {run.own} (same target, recipe and seeds; "
             f"teacher key {run.key[:12]})")
        return
    world = dist.world_size()
    _log(f"teacher trajectories: {len(run.seeds)} seeds x {cfg.traj_tokens} greedy tokens"
         + (f", sharded over {world} ranks" if world > 1 else ""))
    t0 = time.perf_counter()
    with teacher_autocast(rt, run.teacher_dtype):
        run.teacher = (sized_teacher(run) if run.budget_minutes is not None and "corpus_seeds" not in run.pinned
                       else _teacher(run, run.seeds))
    run.teacher_seconds = time.perf_counter() - t0
    trajs = run.teacher.sequences
    _log(f"teacher trajectories: {len(trajs) * cfg.traj_tokens} tokens in {run.teacher_seconds:.1f}s")
    kept, run.seeds, run.held_record = drop_leaking_trajectories(rt, trajs, run.seeds)
    if len(kept) != len(trajs):
        dropped = set(run.held_record.get("dropped_indexes", []))
        run.teacher = run.teacher.select([i for i in range(len(trajs)) if i not in dropped])
    run.trajs = run.teacher.sequences


def _teacher(run: PrepareRun, seeds: list[list[int]], work: bool = True) -> TeacherData:
    cfg = run.cfg
    return teacher_data(run.rt, seeds, cfg.traj_tokens, run.taps if run.imported is None else (), run.top_k,
                        work=run.work if work else None, progress=run.progress, dtype=run.teacher_dtype,
                        padded=cfg.teacher_batching == "padded", batch=run.plan.teacher_batch,
                        prompt_preds=run.imported is None and cfg.train.seed_labels == "target")


def sized_teacher(run: PrepareRun) -> TeacherData:
    """The teacher under a prepare budget: a probe chunk of seeds first (timed; the plan logged from it; a budget
    that cannot afford the minimum set refused), then chunks of a seeded random order of the rest while the
    generation share of the budget lasts (`timebudget.sized_generation`). The kept seeds are recorded in the work
    folder, so a resumed run reloads the same set."""
    seeds = run.seeds
    marker = run.work / "teacher-plan.json"
    digest = hashlib.sha256(json.dumps([run.key, len(seeds)]).encode()).hexdigest()
    planned = _read_plan(marker, digest, len(seeds))
    if planned is not None:  # a resumed run: the same seeds as the killed one, reloaded from its work folder
        run.seeds = [seeds[i] for i in planned["kept"]]
        run.teacher_sizing = planned["record"]
        return _teacher(run, run.seeds)
    allowance = generation_allowance(run.budget_minutes)
    order = list(range(len(seeds)))
    random.Random(run.cfg.seed).shuffle(order)

    def on_probe(rate: float) -> None:
        check_teacher_probe(run.budget_minutes, time.perf_counter() - run.t_start, rate, len(seeds))
        _log(teacher_plan_line(run.budget_minutes, len(seeds), rate, allowance, run.cfg.traj_tokens,
                               forced_token_budget(run.cfg, run.rt.vocab_size) if run.rt.tokenizer else 0))

    got = sized_generation(lambda idx: _teacher(run, [seeds[i] for i in idx], work=False), len(seeds), allowance,
                           first=PROBE_SEEDS, order=order, agree=dist.broadcast_object, on_probe=on_probe)
    data = functools.reduce(TeacherData.extend, got.parts)
    by_index = sorted(range(len(got.kept)), key=lambda j: got.kept[j])  # back to the seeds' own order
    data = data.select(by_index)
    kept = sorted(got.kept)
    run.seeds, run.teacher_sizing = [seeds[i] for i in kept], got.record
    if len(kept) < len(seeds):
        log.info("teacher sized to the prepare budget: %d of %d seeds in %.0f s (allowance %.0f s)", len(kept),
                 len(seeds), got.record["seconds"], allowance)
    if run.lead:  # what a resumed run reloads: the kept seeds' data under their own key, and which seeds they were
        save_teacher(run.work, data, run.seeds, run.cfg.traj_tokens, run.taps if run.imported is None else (),
                     run.top_k, run.teacher_dtype, run.cfg.teacher_batching == "padded",
                     run.imported is None and run.cfg.train.seed_labels == "target")
        write_json_atomic(marker, {"digest": digest, "kept": kept, "record": got.record})
    dist.barrier()
    return data


def _read_plan(path: Path, digest: str, n: int) -> dict | None:
    """A killed run's teacher plan from its work folder, when it is this run's (same key and seed count)."""
    try:
        doc = json.loads(path.read_text()) if path.is_file() else None
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("digest") != digest or not isinstance(doc.get("record"), dict):
        return None
    kept = doc.get("kept")
    if not isinstance(kept, list) or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < n
                                             for i in kept) or kept != sorted(set(kept)) or not kept:
        return None
    return doc


def force_text(run: PrepareRun) -> None:
    """Teacher-forced passes over the training text (a drafter we train only), in what the teacher left of the
    generation share where there is a prepare budget."""
    if run.imported is not None:
        return
    seconds = None
    if run.budget_minutes is not None and run.teacher_sizing is not None:
        seconds = max(0.0, generation_allowance(run.budget_minutes) - run.teacher_seconds)
    run.forced, run.forced_record = forced_teacher(run.rt, run.cfg, run.family, run.seeds, run.taps, run.progress,
                                                   run.plan.forced_batch, seconds=seconds)


def obtain_drafter(run: PrepareRun) -> None:
    """The imported drafter as it is, or a drafter trained on the teacher data, its time capped by the prepare
    budget (the fits' cost probed first, `timebudget.plan_training`)."""
    rt, cfg = run.rt, run.cfg
    if run.imported is not None:
        run.budget_record = {"budget_minutes": None, "why": "an imported drafter: nothing is trained"}
        run.drafter = run.imported
        run.metrics = {"imported": True, "source": str(run.drafter_source), "source_sha256": run.source_sha}
        _log(f"using the transformers-format drafter {run.drafter_source} (block {run.drafter.cfg.block_size}, "
             f"taps {list(run.drafter.cfg.taps)})")
        return
    dcfg = DrafterConfig(hidden_size=rt.hidden_size, vocab_size=rt.vocab_size, taps=run.taps,
                         block_size=cfg.block_size, num_layers=cfg.drafter_layers, num_heads=cfg.drafter_heads,
                         intermediate_size=cfg.drafter_intermediate or 2 * rt.hidden_size,
                         mask_token_id=mask_token_for(rt.config), anchor_embed=cfg.anchor_embed)
    sched = resolve_schedule(cfg.train, rt.vocab_size)
    budget = f", budget {sched.budget_minutes:g} min" if sched.budget_minutes else ""
    time_cap, run.budget_record = None, {"budget_minutes": run.budget_minutes}
    if run.budget_minutes is not None:  # rank 0 probes the fits' cost; every rank trains to its cap
        if run.lead:  # the fits run on the CPU (`devices`), so their cost is probed there
            with runtime_on(rt, run.plan.fits_device):
                time_cap, run.budget_record = plan_training(rt, dcfg, cfg.train, run.trajs, run.prompt_lens, cfg,
                                                            run.family, run.budget_minutes, run.t_start)
        time_cap, run.budget_record = dist.broadcast_object((time_cap, run.budget_record))
        if run.teacher_sizing is not None:
            run.budget_record["teacher"] = run.teacher_sizing
    if time_cap is not None and not (sched.budget_minutes and 60.0 * sched.budget_minutes <= time_cap):
        budget += f", cut to {time_cap:.0f} s by the prepare budget"  # named only where the cap binds
    _log(f"training the drafter ({sched.steps} steps{budget}, block {cfg.block_size}, taps {list(dcfg.taps)})")
    data = run.teacher if run.forced is None else run.teacher.extend(run.forced)
    run.drafter, run.metrics = train_drafter(rt, run.trajs, dcfg, cfg.train, progress=run.progress, teacher=data,
                                             work=run.work, time_cap=time_cap)


def write_drafter(run: PrepareRun) -> None:
    """The drafter's weights (float32 on the CPU, whatever device trained it) and the trajectories the fits read."""
    dcfg = run.drafter.cfg  # training may have set its draft vocabulary
    sd = {k: (v.detach().float() if v.is_floating_point() else v.detach()).cpu().contiguous()
          for k, v in run.drafter.state_dict().items()}
    write_atomic(run.out / DRAFTER_FILE, tensor_bytes({"config": dcfg.to_dict(), "state_dict": sd}))
    run.files[DRAFTER_FILE] = file_entry(run.out / DRAFTER_FILE)
    write_json_atomic(run.out / TRAJ_FILE, {"family": run.family, "prompt_lens": run.prompt_lens,
                                            "sequences": run.trajs})
    run.files[TRAJ_FILE] = file_entry(run.out / TRAJ_FILE)


def fit_methods(run: PrepareRun) -> None:
    """Every registered fitter on the drafter, on the CPU whatever device trained (`devices`), its files written."""
    t_fit = time.perf_counter()
    fits_device = run.plan.fits_device
    end = None if run.budget_minutes is None else fits_deadline(run.budget_minutes, run.t_start)
    cut: dict[str, list] = {}
    with runtime_on(run.rt, fits_device):
        ctx = FitContext(run.rt, run.drafter.to(fits_device), run.trajs, run.prompt_lens, run.cfg, run.family,
                         run.progress)
        todo = list(fitters())
        for i, fitter in enumerate(todo):
            _log(f"fitting {fitter.name}")
            # under a budget each fitter's optimisation gets an equal share of the time left (`fit_deadline`)
            share = None if end is None else time.perf_counter() + (end - time.perf_counter()) / (len(todo) - i)
            with fit_deadline(share) as cuts:
                res = fitter(ctx)
            if cuts:
                cut[fitter.name] = cuts
            for fname, data in res.get("files", {}).items():
                write_atomic(run.out / fname, data)
                run.files[fname] = file_entry(run.out / fname)
            run.fits[fitter.name] = res.get("meta", {})
            trim_free_memory()
    run.fit_seconds = time.perf_counter() - t_fit
    if cut:  # the manifest says which heads the budget stopped early
        run.budget_record["fits_stopped_early"] = cut


def write_run_manifest(run: PrepareRun) -> None:
    """The manifest: every file's SHA-256 and size, and how they were built (config, seeds, teacher, budget)."""
    cfg, padded = run.cfg, run.cfg.teacher_batching == "padded"
    extra = {
        "recipe": RECIPE,
        "prepare_config": cfg.to_dict(),
        "seeds": {"torch": cfg.seed, "train": cfg.train.seed, "family": run.family, "train_seed_count": len(run.seeds)},
        "train_data": run.train_record,
        "drafter": {"config": run.drafter.cfg.to_dict(), "parameters": parameter_count(run.drafter), **run.metrics},
        "teacher": {"sequences": len(run.trajs), "tokens_per_seed": cfg.traj_tokens, "seconds": run.teacher_seconds,
                    "tokens": len(run.trajs) * cfg.traj_tokens,
                    "batched": (f"mixed lengths left-padded, up to {PADDED_BATCH} a batch" if padded
                                else "by prompt length, no padding"), "key": run.key,
                    "ranks": dist.world_size(), "taps_and_top_k": "captured in the generating forwards",
                    "top_k": run.top_k, "dtype": run.teacher_dtype,
                    **({"reused_from": str(run.own)} if run.teacher_reused else {})},
        "forced_text": run.forced_record,
        "fits": run.fits,
        "fit_seconds": run.fit_seconds,
        "prepare_budget": run.budget_record,
        "held_out": run.held_record,
        "prepare_seconds": time.perf_counter() - run.t_start,
    }
    if not run.plan.on_cpu:  # a CPU manifest stays what it was: no device record means the CPU recipe
        extra["device"] = {**run.plan.record(), "numerics": numerics_record(run.plan.device)}
    write_manifest(run.out, run.ident, run.files, extra)
