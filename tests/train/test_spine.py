"""The spine: a reader follows a training run through at most 10 files of jaxformer/train/
(issue 64), the functions a tiny `train()` calls, seen with sys.setprofile."""

import sys

import jaxformer as jf
from jaxformer.train import loop
from jaxformer.train.config import RunConfig


def test_a_tiny_run_calls_functions_in_at_most_10_files_of_train(tmp_path):
    cfg = jf.TransformerConfig.tiny(
        259, num_encoder_layers=1, num_decoder_layers=1, d_model=32, d_ff=64, num_heads=2
    )
    run = RunConfig.from_options(
        task="dates",
        steps=4,
        out=str(tmp_path),
        eval_every=2,
        eval_examples=8,
        checkpoint_every=2,
        batch_size=8,
    )
    seen = set()

    def called(frame, event, arg):
        if event == "call" and "/jaxformer/train/" in frame.f_code.co_filename:
            seen.add(frame.f_code.co_filename.rsplit("/", 1)[1])

    sys.setprofile(called)
    try:
        loop.train(cfg, run, progress=False)
    finally:
        sys.setprofile(None)
    assert "loop.py" in seen and len(seen) <= 10, sorted(seen)
