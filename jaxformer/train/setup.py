"""A run before its first step (`set_up`): its tokenizer and data, the model, the
optimizer and schedule, the fresh train state, and the placement that lays them out and
compiles the steps. Everything here can fail before the run folder exists."""

from __future__ import annotations

import dataclasses
import operator
import os
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import numpy as np
import optax
from flax import nnx

from jaxformer import trackers
from jaxformer.checkpoints import restore_model
from jaxformer.checks import BadValue, as_given
from jaxformer.config import TransformerConfig
from jaxformer.data import (
    BPETokenizer,
    ByteTokenizer,
    TaskData,
    TextData,
    TrainingData,
    TsvData,
)
from jaxformer.data import registry as datasets
from jaxformer.data.datasets import read_text_lines
from jaxformer.data.shards import ShardData, shard_tokenizer
from jaxformer.data.tokenizers import Tokenizer
from jaxformer.files import code_version, describe_device, versions
from jaxformer.models import MODEL_KINDS, count_params
from jaxformer.nn import add_lora, merge_lora, plain
from jaxformer.parallel import Placement, make_placement
from jaxformer.parallel.rules import batch_sharding
from jaxformer.train.config import RunConfig
from jaxformer.train.optim import make_optimizer, make_schedule
from jaxformer.train.steps import (
    TrainState,
    create_train_state,
    make_eval_step,
    make_train_step,
    state_layout,
)


@dataclasses.dataclass(frozen=True)
class Setup:
    """What `set_up` builds for a run.

    config           the model's config, with the tokenizer's vocabulary
    requested_vocab  the vocab_size the model config asked for
    graphdef, state  the model's structure and the fresh TrainState (plain arrays)
    layout           the state's shapes with the parameters' logical axes
    param_count      the model's parameters
    trained_count    those the optimizer trains (a LoRA run's adapters; else all)
    placement        lays out state and batches, compiles the steps (`jaxformer.parallel`)
    train_fn         the uncompiled step, (state, batch) -> (state, metrics)
    train_step       train_fn compiled, donating the state
    eval_step        (params, batch) -> LossSums, compiled
    internals_step   train_step returning metrics["internals"] too, or None
    """

    run: RunConfig
    tokenizer: Tokenizer
    data: TrainingData
    config: TransformerConfig
    requested_vocab: int
    graphdef: nnx.GraphDef
    state: TrainState
    layout: TrainState
    param_count: int
    trained_count: int
    placement: Placement
    train_fn: Callable
    train_step: Callable
    eval_step: Callable
    internals_step: Callable | None

    def step_for(self, done: int) -> Callable:
        """The step that makes step `done`: with log_internals N the internals variant on
        step 1 and every Nth (compiled on first use), else the plain one."""
        n = self.run.runtime.log_internals
        if n is not None and (done == 1 or done % n == 0):
            return self.internals_step
        return self.train_step

    def description(self) -> dict[str, Any]:
        """summary.json's fields that describe the run: model, layout, configs, data counts,
        and the machine (a CPU's processor), code and package versions that finished it
        (train.log names the code of each start, so a run resumed after a change says so)."""
        counts = {"data_counts": dict(self.data.counts)} if self.data.counts else {}
        return {
            "params": self.param_count,
            **({"trained_params": self.trained_count} if self.run.optim.lora_rank else {}),
            "device": str(jax.devices()[0].device_kind),
            "machine": describe_device(),
            "code": code_version(),
            "versions": versions(),
            "layout": self.placement.description,
            "model_kind": self.data.model_kind,
            "model_config": self.config.to_dict(),
            "run": self.run.to_dict(),
            **counts,
        }

    @property
    def meta(self) -> dict[str, Any]:
        """What a checkpoint must match to be resumed by this run."""
        return {
            "model_kind": self.data.model_kind,
            "model_config": self.config.to_dict(),
            "run": self.run.resume_settings(),
        }


def set_up(
    model_config: TransformerConfig,
    run: RunConfig,
    data: tuple[Tokenizer, TrainingData] | None = None,
) -> Setup:
    """The run's tokenizer, data, model (a fresh one of `model_config` with the
    tokenizer's vocabulary, or `run.data.init_from`'s), optimizer, fresh train state, placement
    and compiled steps; bad input raises here, before anything is written. `data`: the
    tokenizer and data to train on, already built for this run (another seed's,
    `reseeded`), instead of building them."""
    if run.data.init_from is None:
        tokenizer, data = data or build_data(run, vocab_size=model_config.vocab_size)
        config = _fit_config(model_config, tokenizer, data, run.data.task is None)
        model = MODEL_KINDS[data.model_kind](config, rngs=nnx.Rngs(run.runtime.seed))
    else:
        model, tokenizer, data = _pretrained(run)
        config = model_config = model.config
    if (o := run.optim).lora_rank:  # fresh adapters (on a LoRA run's merged weights)
        lora = dict(alpha=o.lora_alpha, targets=o.lora_targets, seed=run.runtime.seed)
        model = add_lora(merge_lora(model), o.lora_rank, **lora)
    _check_data(run, data)
    _check_memory(config, run, data.max_len)
    for name in trackers.names(run.runtime.tracker)[1:]:
        trackers.package(name)  # installed, before the folder exists
    graphdef, state, train_fn, eval_fn, internals_fn = _steps(model, config, run)
    layout = state_layout(graphdef, state)
    placement = make_placement(run.runtime.mesh, pmap=run.runtime.pmap)
    placement.check_rows(
        run.optim.batch_size // run.optim.accum_steps,
        f"batch_size / accum_steps = {run.optim.batch_size} / {run.optim.accum_steps} =",
    )
    data = data.for_process(_own_rows(placement, run.optim.batch_size))
    return Setup(
        run=run,
        tokenizer=tokenizer,
        data=data,
        config=config,
        requested_vocab=model_config.vocab_size,
        graphdef=graphdef,
        state=state,
        layout=layout,
        param_count=count_params(model),
        trained_count=count_params(model, nnx.LoRAParam if run.optim.lora_rank else nnx.Param),
        placement=placement,
        train_fn=train_fn,
        train_step=placement.compile(train_fn, layout, donate_state=True),
        eval_step=placement.compile(eval_fn, layout.params),
        internals_step=internals_fn and placement.compile(internals_fn, layout, donate_state=True),
    )


def _check_data(run: RunConfig, data: TrainingData) -> None:
    """The options that need data of one kind: refused for the other."""
    if not run.data.pack and data.model_kind != "DecoderLM":
        raise BadValue(
            f"{as_given('pack', False)} lays out language-model rows; {run.data.dataset} is "
            "a translation dataset"
        )
    if run.data.batch_tokens and data.model_kind != "Transformer":
        raise BadValue(
            f"{as_given('batch_tokens')} batches translation pairs; {run.data.dataset} is a "
            "language-model dataset"
        )
    if run.eval.final_test and not data.test_pairs:
        raise BadValue(
            f"{as_given('final_test')} scores the final model on a separate test split (a "
            f"dataset's); {type(data).__name__} has none: its held-out pairs are the ones "
            "evaluated"
        )


def _check_memory(config: TransformerConfig, run: RunConfig, length: int) -> None:
    """Refuse a batch whose activations cannot fit: a lower bound, the residual stream a
    step keeps for its backward pass (rows x length x layers x d_model, float32), against
    the memory of this host, or of a device that reports it."""
    rows = run.optim.batch_size // run.optim.accum_steps
    layers = config.num_encoder_layers + config.num_decoder_layers
    per_row = 4 * length * layers * config.d_model
    stats = jax.local_devices()[0].memory_stats() or {}
    memory = stats.get("bytes_limit") or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if rows * per_row > memory * jax.local_device_count():
        fits = memory * jax.local_device_count() // per_row * run.optim.accum_steps
        raise BadValue(
            f"{as_given('batch_size', run.optim.batch_size)} needs more than "
            f"{rows * per_row / 2**30:,.0f} GiB of activations, past this machine's "
            f"{memory / 2**30:,.0f} GiB a device: give at most {fits:,} rows"
        )


def build_data(
    run: RunConfig, tokenizer: Tokenizer | None = None, vocab_size: int | None = None
) -> tuple[Tokenizer, TrainingData]:
    """The tokenizer (`tokenizer`, else the one the run asks for) and the dataset of a run.
    A BPE tokenizer learns from the data file, or from a dataset's training books only;
    token shards without a tokenizer.json beside them hold `vocab_size` ids (the model's)."""
    lm = dict(seq_len=run.data.seq_len, seed=run.runtime.seed, pack=run.data.pack)
    if run.data.data_shards:
        shards, eot_id = run.data.data_shards, run.data.eot_id
        tokenizer = tokenizer or shard_tokenizer(shards, vocab_size, eot_id)
        options = lm | dict(eot_id=eot_id, dev_size=run.eval.eval_examples)
        return tokenizer, ShardData(shards, run.data.val_shards, tokenizer, **options)
    if run.data.dataset:
        corpus = datasets.load(run.data.dataset)
        tokenizer = tokenizer or _tokenizer(run, corpus.training_texts)
        return tokenizer, corpus.data(tokenizer, **_pair_options(run), pack=run.data.pack)

    def lines():
        return [line for _, line in read_text_lines(run.data.data_tsv or run.data.data_text)]

    tokenizer = tokenizer or _tokenizer(run, lines)
    if run.data.task:
        return tokenizer, TaskData(
            run.data.task, tokenizer, seed=run.runtime.seed, dev_size=run.eval.eval_examples
        )
    if run.data.data_tsv:
        return tokenizer, TsvData(run.data.data_tsv, tokenizer, **_pair_options(run))
    return tokenizer, TextData(run.data.data_text, tokenizer, **lm)


def _own_rows(placement: Placement, rows: int) -> np.ndarray | None:
    """The rows of a batch of `rows` that this process's devices hold; None (all) in a
    single process or with pmap."""
    if jax.process_count() == 1 or placement.mesh is None:
        return None
    held = batch_sharding(placement.mesh, placement.rules).addressable_devices_indices_map((rows,))
    return np.unique(np.concatenate([np.arange(rows)[index] for index in held.values()]))


def _pair_options(run: RunConfig) -> dict:
    """What a translation dataset (a registered one or a TSV file) takes from the run."""
    return dict(
        max_len=run.data.seq_len,
        seed=run.runtime.seed,
        dev_size=run.eval.eval_examples,
        pad_multiple=run.data.pad_multiple,
        shared_lengths=run.data.shared_lengths,
        batch_tokens=run.data.batch_tokens,
    )


def _tokenizer(run: RunConfig, texts: Callable[[], list[str]]) -> Tokenizer:
    """The run's tokenizer; BPE learns from `texts()`."""
    if run.data.tokenizer == "bpe":
        return BPETokenizer.train(texts(), run.data.bpe_vocab_size)
    return ByteTokenizer()


def _pretrained(run: RunConfig) -> tuple[nnx.Module, Tokenizer, TrainingData]:
    """(model, tokenizer, data) of a run that fine-tunes init_from: a jaxformer run folder
    (its averaged parameters, else its latest checkpoint's) or a Hugging Face model folder."""
    model, tokenizer = restore_model(run.data.init_from)
    _, data = build_data(run, tokenizer)
    kind = type(model).__name__
    if kind != data.model_kind:
        needs = {
            "DecoderLM": f"text ({as_given('data_text')}, or a text {as_given('dataset')})",
            "Transformer": f"pairs (a {as_given('task')}, {as_given('data_tsv')}, or a "
            f"translation {as_given('dataset')})",
        }
        raise BadValue(f"{run.data.init_from} holds a {kind}, which trains on {needs[kind]}")
    if model.config.max_len < data.max_len:
        raise BadValue(
            f"the data needs sequences of {data.max_len} tokens but {run.data.init_from} takes "
            f"{model.config.max_len} (its {as_given('max_len')}; a Hugging Face "
            "max_position_embeddings)"
        )
    return model, tokenizer, data


def _fit_config(
    config: TransformerConfig, tokenizer: Tokenizer, data: TrainingData, cut: bool
) -> TransformerConfig:
    """`config` with the tokenizer's vocabulary, checked against the data's length (with
    `cut`, the run's seq_len: a file's or a corpus's sequences are cut to it)."""
    if config.max_len < data.max_len:
        if cut:
            raise BadValue(
                f"{as_given('seq_len', data.max_len)} is more than the model's "
                f"{as_given('max_len', config.max_len)}"
            )
        raise BadValue(
            f"the data needs sequences of {data.max_len} tokens but "
            f"{as_given('max_len', config.max_len)}"
        )
    return config.replace(vocab_size=tokenizer.vocab_size)


class _Steps(NamedTuple):
    """A run's fresh train state and its pure step functions."""

    graphdef: nnx.GraphDef
    state: TrainState
    train: Callable
    eval: Callable
    train_with_internals: Callable | None  # None unless run.runtime.log_internals


def _steps(model: nnx.Module, config: TransformerConfig, run: RunConfig) -> _Steps:
    """The run's optimizer and schedule, its fresh train state and its step functions."""
    schedule = make_schedule(
        run.optim.schedule,
        lr=run.optim.peak_lr,
        d_model=config.d_model,
        warmup_steps=run.optim.warmup,
        total_steps=run.optim.steps,
    )
    optimizer = make_optimizer(
        schedule,
        name=run.optim.optimizer,
        weight_decay=run.optim.weight_decay,
        clip_norm=run.optim.clip_norm,
        **run.optim.optimizer_options,
    )
    trainable = None
    if run.optim.lora_rank:  # the optimizer and its state see the adapters alone
        is_lora = lambda v: v.replace(isinstance(v, nnx.LoRAParam))  # noqa: E731
        is_variable = lambda x: isinstance(x, nnx.Variable)  # noqa: E731
        trainable = plain(jax.tree.map(is_lora, nnx.state(model), is_leaf=is_variable))
        frozen = jax.tree.map(operator.not_, trainable)
        optimizer = optax.transforms.selective_transform(optimizer, freeze_mask=frozen)
    graphdef, state = create_train_state(model, optimizer, run.runtime.seed)
    smoothing = config.label_smoothing
    kw = dict(label_smoothing=smoothing, accum_steps=run.optim.accum_steps, trainable=trainable)
    internals_fn = None
    if run.runtime.log_internals is not None:
        internals_fn = make_train_step(graphdef, optimizer, schedule, **kw, internals=True)
    return _Steps(
        graphdef,
        state,
        train=make_train_step(graphdef, optimizer, schedule, **kw),
        eval=make_eval_step(graphdef, label_smoothing=smoothing),
        train_with_internals=internals_fn,
    )
