"""The trainer most tests build: FTISTrainer on a tiny Llama, with the digit-match reward, on 2-digit addition."""

from trl_ftis import FTISTrainer
from trl_ftis.demo.tiny import build_tiny_llama
from trl_ftis.tasks.addition import addition_dataset, digit_match_reward


def tiny_trainer(tokenizer, args, *, hidden_size=64, seed=0, train_size=64, dataset_seed=1, model=None, **kwargs):
    """`FTISTrainer` on `build_tiny_llama(tokenizer, hidden_size, seed)` (or `model`) and `train_size` addition
    problems drawn with `dataset_seed`; `kwargs` go to the trainer."""
    model = model if model is not None else build_tiny_llama(tokenizer, hidden_size=hidden_size, seed=seed)
    dataset = addition_dataset(train_size, seed=dataset_seed)
    return FTISTrainer(
        model, digit_match_reward, args=args, train_dataset=dataset, processing_class=tokenizer, **kwargs
    )


def exchange_trainer(tokenizer, make_args, url, mode, *, callbacks=(), **overrides):
    """A tiny trainer `"me"` in the swarm at `url` with `exchange_mode=mode` (3 steps unless `overrides` say),
    with `callbacks` added (stand-in peers publishing as it steps)."""
    settings = {"exchange_url": url, "peer_id": "me", "exchange_mode": mode, "max_steps": 3}
    settings.update(overrides)
    trainer = tiny_trainer(tokenizer, make_args(**settings))
    for callback in callbacks:
        trainer.add_callback(callback)
    return trainer


def without_control_tokens(rows, tokenizer):
    """`rows` with every special or added token of `tokenizer` inside a completion replaced by the digit "0" (a final
    end of sequence stays). Untrained tiny models write <pad>, <bos> or <unk> inside some completions, which
    receivers drop (`special_tokens`, tested in test_hostile_rows.py); tests about what peer rows do in the loss or the
    summary take the rows as a trained model would write them. Changes `rows` in place and returns them."""
    from trl_ftis.swarm.admission import control_token_ids

    control = set(control_token_ids(tokenizer).tolist())
    digit = tokenizer.convert_tokens_to_ids("0")
    for row in rows:
        last = len(row.completion_ids) - 1
        row.completion_ids = [
            digit if t in control and not (i == last and t == tokenizer.eos_token_id) else t
            for i, t in enumerate(row.completion_ids)
        ]
    return rows
