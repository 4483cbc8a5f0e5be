"""What a run shows a person as text: progress while it trains, a line per evaluation, at
the end a table of held-out examples with the totals, and the predictions files
(predictions.tsv, test_predictions.tsv); its pictures are `jaxformer.plots`."""

from __future__ import annotations

import pathlib
import re
import shlex
import sys
from typing import Any

from jaxformer.checks import as_given
from jaxformer.files import command_line, write_whole


class Progress:
    """A tqdm bar on a terminal; elsewhere (a log file, CI) a plain line every tenth of
    the run, so that logs hold no carriage returns."""

    def __init__(self, enabled: bool, start: int, total: int):
        self.enabled, self.total, self.every = enabled, total, max(1, total // 10)
        self.next_line = (start // self.every + 1) * self.every
        self.bar = None
        if enabled and sys.stderr.isatty():
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, initial=start, unit="step", dynamic_ncols=True)

    def show(self, record: dict[str, float]) -> None:
        """The latest logged metrics."""
        loss, lr, speed = record["loss"], record["lr"], record["tokens_per_second"]
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{speed:,.0f}")
        elif self.enabled and record["step"] >= self.next_line:
            self.next_line += self.every
            print(
                f"step {record['step']}/{self.total}: loss {loss:.4f}, lr {lr:.2e}, "
                f"{speed:,.0f} tokens/s",
                flush=True,
            )

    def write(self, line: str) -> None:
        """A line of results (above the bar), when enabled."""
        if self.bar is not None:
            self.bar.write(line)
        elif self.enabled:
            print(line, flush=True)

    def advance(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def eval_line(step: int, m: dict[str, float], averaged_steps: list[int] | None = None) -> str:
    """One evaluation's results; `averaged_steps`: of the mean of those checkpoints."""
    what = f"step {step}" if averaged_steps is None else _averaged(averaged_steps)
    return f"{what}: " + _held_out(m["eval_nll"], m["eval_perplexity"], m["eval_token_accuracy"], m)


def print_summary(summary: dict[str, Any], examples: list[tuple[str, str, str]], out) -> None:
    """The held-out examples (input, prediction, target) as a table, then the totals."""
    if examples:
        rows = [("input", "prediction", "target", "correct")]
        rows += [(s, p, t, "yes" if p == t else "NO") for s, p, t in examples]
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        print()
        for row in rows:
            print("  ".join(cell.ljust(w) for cell, w in zip(row, widths + [0], strict=True)))
    print(f"\n{_steps_line(summary)}, {summary['params']:,} parameters")
    if summary.get("averaged_eval"):
        final = summary["final_eval"]
        keys = ("eval_nll", "eval_perplexity", "eval_token_accuracy")
        print("last checkpoint: " + _held_out(*(final[k] for k in keys), final))
        print(eval_line(summary["steps"], summary["averaged_eval"], summary["averaged_steps"]))
    else:
        keys = ("eval_nll", "eval_perplexity", "token_accuracy")
        print(_held_out(*(summary[k] for k in keys), summary))
    if summary.get("test_pairs"):
        scores = ", ".join(_scores(summary, "test_"))
        print(f"test ({summary['test_pairs']:,} pairs, final model): {scores}")
    plots = " ".join(p.name for p in sorted(pathlib.Path(out).glob("*.png")))
    print(f"results in {out}/: summary.json metrics.jsonl {plots}")
    text = shlex.quote(examples[0][0]) if examples else "TEXT"
    variants = "".join(f" --variants {shlex.quote(v)}" for v in _variants_given())
    print(f"next: jaxformer generate --checkpoint {shlex.quote(str(out))}{variants} --input {text}")


def _variants_given() -> list[str]:
    """The --variants files or modules of this command as typed: the model needs them to
    load (its registered activations, norms, kernels)."""
    words, given = sys.argv[1:], []
    for i, word in enumerate(words):
        if word == "--variants" and i + 1 < len(words):
            given.append(words[i + 1])
        elif word.startswith("--variants="):
            given.append(word.removeprefix("--variants="))
    return given


def continue_command() -> str:
    """How a stopped run continues: on the command line, this command with --resume (the
    exact command to type); in Python, the argument resume=True."""
    resume = as_given("resume", True)
    if not resume.startswith("--"):
        return resume
    command = command_line()
    return command if resume in shlex.split(command) else f"{command} {resume}"


def _steps_line(summary: dict[str, Any]) -> str:
    """The steps and their time; a resumed run's share of them, and its speed."""
    steps, run = summary["steps"], summary["steps_run"]
    head = f"{steps} steps in {summary['wall_seconds']:.0f} s"
    if run == 0:
        return f"{head} in all (the run was already complete: no steps in this process)"
    where = f" in all, steps {steps - run + 1}-{steps} in this process" if run < steps else ""
    return f"{head}{where} ({summary['train_tokens_per_second']:,.0f} target tokens/s)"


def _held_out(nll: float, perplexity: float, accuracy: float, scores: dict) -> str:
    """The losses, then whichever of exact match, BLEU and chrF `scores` holds."""
    losses = f"held-out NLL {nll:.4f} (perplexity {perplexity:.3f}), token accuracy {accuracy:.2%}"
    return ", ".join([losses, *_scores(scores)])


def _scores(scores: dict, prefix: str = "") -> list[str]:
    """Whichever of exact match, BLEU and chrF `scores` holds under names with `prefix`."""
    shown = []
    if scores.get(prefix + "exact_match") is not None:
        shown.append(f"exact match {scores[prefix + 'exact_match']:.2%}")
    for key, name in (("bleu", "BLEU"), ("chrf", "chrF")):
        if scores.get(prefix + key) is not None:
            shown.append(f"{name} {scores[prefix + key]:.2f}")
    return shown


def _averaged(steps: list[int]) -> str:
    return f"mean of the checkpoints of steps {', '.join(map(str, steps))}"


def write_predictions(
    pairs: list[tuple[str, str]], predictions: list[str], path: pathlib.Path
) -> None:
    """source<TAB>reference<TAB>prediction, one line per test pair; a tab or line break
    inside a field becomes a space (which changes neither BLEU's 13a tokens nor chrF)."""
    rows = [(s, t, p) for (s, t), p in zip(pairs, predictions, strict=True)]
    text = "".join("\t".join(re.sub(r"[\t\r\n]", " ", f) for f in row) + "\n" for row in rows)
    write_whole(path, text)


def internals_record(step: int, internals: dict) -> dict[str, float]:
    """A metrics.jsonl record of the train step's internals: flat `internals/<key>` keys."""
    return {"step": step, **{f"internals/{k}": float(v) for k, v in internals.items()}}
