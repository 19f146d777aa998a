"""`FTISConfig`: `GRPOConfig` (every default as TRL sets it) plus the F-TIS options, each documented here; what the
config does with them lives by concern: the paper's preset (`trl_ftis.presets`), the checks of the objective's and the
swarm's fields (`trl_ftis.config_checks`), and the secrets (`trl_ftis.config_secrets`)."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field

from trl import GRPOConfig

from .config_checks import COLLABORATION_MODES, PEER_WEIGHTINGS, check_ftis_fields
from .config_secrets import SecretFields
from .exchange_mode_registry import EXCHANGE_MODE_NAMES
from .objective import FILTER_MODES, KL_REDUCTIONS, THRESHOLD_MODES
from .presets import check_preset, resolve_preset_options, say_what_the_preset_set
from .round_window import DEFAULT_MAX_ROUNDS_AHEAD, DEFAULT_MAX_STALENESS, DEFAULT_PEER_TIMEOUT
from .shared_names import SWARM_NAME_ENV, SWARM_RUN_ENV, SWARM_SECRET_ENV


@dataclass(repr=False)  # `repr()` is SecretFields's, which redacts
class FTISConfig(SecretFields, GRPOConfig):
    r"""
    Configuration class for the [`FTISTrainer`].

    [`FTISConfig`] inherits every parameter of TRL's [`~trl.GRPOConfig`] and adds the options of the F-TIS objective
    (Filtered Truncated Importance Sampling, ["F-TIS: Harnessing Diverse Models in Collaborative
    GRPO"](https://arxiv.org/abs/2605.22537), Blagoev et al., 2026) and of the swarm that exchanges completions between
    peers (see `docs/objective.md` and `docs/swarm.md`).

    Using [`~transformers.HfArgumentParser`] we can turn this class into
    [argparse](https://docs.python.org/3/library/argparse#module-argparse) arguments that can be specified on the
    command line.

    Parameters:
        > Parameters that control the F-TIS objective

        variant (`str`, *optional*, defaults to `"f-tis"`):
            Objective variant: `"f-tis"` (the method), or one of the paper's ablations `"nois"`, `"vis"`, `"tis"`,
            `"f-nois"`, `"f-vis"`. `tis` multiplies each token by the truncated weight `min(exp(ℓθ - ℓgen), C)`;
            `vis` clips the ratio against the generator's log-probs instead of the batch-time ones; `nois` uses
            neither. The `f-` prefix adds the filter that zeroes the advantage of far off-policy negative samples.
        is_cap (`float`, *optional*, defaults to `2.0`):
            `C`, the upper bound of the truncated importance weight (paper: 2.0). Must be at least 1 so that on-policy
            tokens (weight 1) are never down-weighted.
        kl_threshold (`float`, *optional*, defaults to `50.0`):
            `g`, the filter threshold: a completion with advantage `<= 0` whose filter statistic exceeds `g` gets
            advantage 0 (it still counts in every denominator). Paper: 50.0. Small models with short completions
            are much closer than this: see `docs/objective.md`.
        kl_reduction (`str`, *optional*, defaults to `"group_max_len"`):
            How the per-token k3 estimates `exp(ℓgen - ℓθ) - (ℓgen - ℓθ) - 1` of a completion become its filter
            statistic: `"group_max_len"` (sum divided by the longest completion of its group, the authors' code),
            `"mean"` (divided by its own length: the length-normalised statistic, with `g` per token) or `"sum"`.
        filter_mode (`str`, *optional*, defaults to `"zero"`):
            What the filter does to a filtered completion: `"zero"` its advantage (the paper's text: the row still
            counts in the loss's normaliser) or `"remove"` it (the authors' code: the loss averages over the surviving
            rows; the kept rows' advantages are scaled by the normaliser's change, per micro-batch).
        kl_threshold_mode (`str`, *optional*, defaults to `"fixed"`):
            `"fixed"`: `g = kl_threshold`. `"quantile"`: `g` follows a running quantile of the peer rows' statistic,
            so that about `filter_target_fraction` of their negative-advantage rows are filtered (`kl_threshold` is
            the starting value; the paper's open problem: the best `g` depends on the models and the training
            phase). Logged as `ftis/kl_threshold`.
        filter_target_fraction (`float`, *optional*, defaults to `0.1`):
            With `kl_threshold_mode="quantile"`: the share of peer negative-advantage rows to filter, in (0, 1).
            No effect with `"fixed"`: building the config logs a warning when it is set to another value there.
        threshold_momentum (`float`, *optional*, defaults to `0.9`):
            With `kl_threshold_mode="quantile"`: the weight of the previous threshold in its running average (in
            log space), in [0, 1). No effect with `"fixed"`: building the config logs a warning when it is set to
            another value there.
        peer_weighting (`str`, *optional*, defaults to `"none"`):
            `"none"`: peer rows enter the loss as F-TIS weights them. `"ess"` (an option): in each micro-batch, each
            peer's rows' advantages are multiplied by that peer's effective sample size fraction there,
            `(Σw)² / (n Σw²)` over its `n` rows' weights `w` (a row's mean truncated weight, 0 when filtered),
            computed without gradient; own rows keep scale 1. The inverse-variance heuristic: rows whose weights
            concentrate on few of them carry about ESS/n of the information of as many on-policy rows, so they are
            down-weighted by it against own rows. The peer rows' mean scale is logged as `ftis/peer/ess_scale`.

        > Parameters that control the swarm

        peer_id (`str`, *optional*):
            This peer's name in the swarm: 1-64 ASCII letters, digits, `_`, `.` or `-`, starting with a letter, a
            digit or `_` (`trl_ftis.peer_ids`). Defaults to `run_name` when it is a valid id, else `"peer"`. When set
            and `run_name` is not, `run_name` becomes the peer id, so each peer's tracker run (wandb, trackio, ...) is
            named after it.
        exchange_url (`str`, *optional*):
            Where peers exchange completions: `dir:///shared/path` (a shared directory, no server),
            `redis://[:password@]host:port/db` or `rediss://...` (Redis Streams), `memory://name` (in-process, for
            tests). `None`: train alone.
        peer_timeout (`float`, *optional*, defaults to `60.0`):
            Seconds a round waits for the expected peers before training on what arrived. Without expected peers a
            round never waits. With `exchange_mode="free"` nothing waits: an expected peer silent for this long is
            counted in `ftis/exchange/peers_missing`.
        expected_peers (`list[str]`, *optional*):
            Peer ids a round waits for (up to `peer_timeout`); this peer's own id may be among them (it is ignored).
            Others are accepted whenever their messages arrive.
        num_expected_peers (`int`, *optional*):
            Alternatively, how many other peers a round waits for, whatever their ids. Setting it together with a
            non-empty `expected_peers` raises `ValueError`.
        swarm_secret (`str`, *optional*):
            Shared secret that signs and verifies every message (HMAC-SHA256); unsigned or wrongly signed messages
            are refused. Unset: the `FTIS_SWARM_SECRET` environment variable, read by [`swarm_credentials`] when the
            trainer starts (the field itself stays `None`). Never logged or saved.
        max_staleness (`int`, *optional*, defaults to `2`):
            Messages from rounds older than `current_round - max_staleness` are dropped. A peer that finds the swarm
            more than this many rounds ahead (it joined late, stalled or resumed an older checkpoint) moves its round
            forward to the swarm's (`docs/swarm.md`, "Catching up"). With `exchange_mode="free"`, counted in each
            sender's own steps: rows more than this many of their sender's steps older than its newest message are
            dropped (`stale`).
        max_peer_rows (`int`, *optional*):
            At most this many peer rows per generation batch (whole groups, shared fairly between peers).
        max_peer_ratio (`float`, *optional*, defaults to `4.0`):
            At most this many peer rows per local row in a generation batch (bounds memory). `None`: no bound.
        peer_micro_batch_size (`int`, *optional*):
            Peer rows enlarge a micro-batch beyond `per_device_train_batch_size`; its loss is then computed and
            back-propagated in chunks of at most this many rows (the same gradient), so that peers add no activation
            memory; the F-TIS statistics are still the micro-batch's. `None`: `per_device_train_batch_size`; `0`: one
            forward and backward per micro-batch. Not under DeepSpeed (it counts every backward as a micro-step), nor
            with an option computed per micro-batch (`peer_weighting="ess"`, `kl_threshold_mode="quantile"`,
            `top_entropy_quantile < 1`).
        trust_peer_rewards (`bool`, *optional*, defaults to `False`):
            Use the rewards peers send. By default they are recomputed with this trainer's own reward functions, so a
            peer cannot inflate its rewards. The reward functions then get this trainer's own dataset columns
            (e.g. the gold answer) for a prompt found in its training set, never the sender's.
        require_known_prompts (`bool`, *optional*, defaults to `False`):
            Drop peer rows whose prompt is not in this trainer's training set, so every received reward is computed
            from local gold columns. Off by default: peers may train on different data (their columns are then
            used).
        collaboration_mode (`str`, *optional*, defaults to `"vertical"`):
            `"vertical"`: each peer samples full groups for its own prompts and received groups keep their own
            advantage normalisation. `"horizontal"` (ablation): peers share prompts and groups of the same prompt
            are normalised together over all models.
        exchange_compact (`bool`, *optional*, defaults to `False`):
            Send 16-bit log-probs and compressed messages (fewer bytes: docs/benchmarks.md, section 3; log-prob error
            below 0.01 nats); the default sends exact fp32 log-probs (8 bytes a token).
        max_rounds_ahead (`int`, *optional*, defaults to `4`):
            Messages from rounds later than `current_round + max_rounds_ahead` are refused (reason `ahead`). With
            `max_staleness` it makes the round window, the only clock of the swarm (`docs/swarm.md`).
        max_round_bytes (`int`, *optional*, defaults to `1073741824`):
            At most this many message bytes (1 GiB) are read from the exchange per round, all peers together; what
            is beyond is dropped unread (reason `round_budget`).
        max_peer_message_rows (`int`, *optional*, defaults to `4096`):
            Completions one peer message may carry (raised to this job's own rows per round when smaller). With
            `max_completion_length` it sets every bound on one message ([`trl_ftis.exchange.Limits.for_receiver`]):
            completions of up to 4 x `max_completion_length` tokens, so that a peer sampling longer completions
            still delivers its shorter ones (longer rows are dropped when admitted, reason `too_long`). A message
            declaring more is refused from its header, unread (reason `limits`), and no message inflates beyond
            what these counts allow.
        swarm_name (`str`, *optional*):
            The swarm this peer belongs to (1-128 printable characters). Every message it sends names it, inside what
            is signed, and every message it receives must name the same (refused: `swarm`). Unset: the
            `FTIS_SWARM_NAME` environment variable (`trl-ftis swarm` sets it to the swarm's `name`), else no binding.
        swarm_run (`str`, *optional*):
            This run of the swarm, an identifier every peer of the run is given (1-128 printable characters; draw a
            new one for each run). Every message names it, inside what is signed, and messages of another run are
            refused (`run`): replays of an earlier run and leftovers in a reused exchange can then neither be trained
            on nor move this peer's round (`docs/security.md`). Unset: `FTIS_SWARM_RUN` (`trl-ftis swarm` draws one
            per run and keeps it for `--only` restarts). A peer that joins a swarm (`exchange_url`) with neither
            refuses to start, naming both: every peer is bound to its run unless told otherwise. An empty string (the
            field or the variable) means no binding, on purpose: messages of any run are taken, and catch-up
            evidence counts only from messages stamped at most 60 s before this peer started.
        private_key_file (`str`, *optional*):
            This peer's Ed25519 private key (PEM, as `trl-ftis keygen` writes it): every message is signed with it.
            The config holds the path; [`swarm_credentials`] loads and checks the file when the trainer starts,
            before the model is loaded (an error names the file).
        peer_keys_file (`str`, *optional*):
            The swarm's public keys (JSON or YAML: peer id -> base64 key, the lines `trl-ftis keygen` prints). When
            set, a message is accepted only when signed by the key registered for the sender it names, so a member
            holding the swarm secret cannot write as another. Loaded and checked like `private_key_file`.
        exchange_mode (`str`, *optional*, defaults to `"sync"`):
            `"sync"`: each step publishes its rows and collects the others' (waiting for `expected_peers`) before it
            trains. `"async"`: a background worker (main process) publishes this step's rows and collects, decodes,
            admits and scores the others' while the step computes; they join the next step (one round of lag,
            counted in the staleness metrics and corrected by the truncated weight). Logged either way:
            `ftis/exchange/blocking_seconds`, the time the training loop waited on the exchange. `"free"`: the
            training loop never waits for another peer: the worker publishes and collects without waiting, and each
            step trains on its own rows plus the admitted peer rows that have arrived and are at most
            `max_staleness` of their sender's own steps old (rounds are each sender's steps; no shared clock).
            `expected_peers` are then never waited for: they are served first by the round budget and counted in
            `ftis/exchange/peers_missing` once silent for `peer_timeout` seconds (`docs/swarm.md`, "Exchange
            modes"). Not `"async"` or `"free"` with `collaboration_mode="horizontal"` (it normalises this step's own
            rows with the same round's peer rows).
        gpu_memory_fraction (`float`, *optional*):
            The share of its GPU's memory this peer may use, in (0, 1]: PyTorch's allocator is capped to it when the
            trainer starts, so that peers sharing a GPU cannot starve each other (the launcher's `gpu_share` passes
            it as `--gpu_memory_fraction`). A colocated vLLM engine allocates inside that cap (it runs in the
            process), and its `vllm_gpu_memory_utilization`, a fraction of the whole GPU, must be below it: training
            gets the rest. `None`: no cap.
        cross_tokenizer (`bool`, *optional*, defaults to `False`):
            Accept peers whose tokenizer differs from this trainer's (refused otherwise, reason `tokenizer`). Such a
            peer must send its completions as text (it does when its own `cross_tokenizer` is on); each text is
            re-tokenised with this trainer's tokenizer (a text that does not survive `decode(encode(text))`, or that
            this tokenizer reads as special tokens, is dropped and counted) and trained on with one sequence-level
            weight `min(exp(Σ ℓθ - Σ ℓgen), C)` and the sequence-level filter statistic (`docs/objective.md`,
            "Peers with other tokenizers"). This peer then also sends its own completions' text (about one byte per
            character more on the wire).
        preset (`str` or `None`, *optional*, defaults to `None`):
            A named set of TRL's own options to start from: `"paper"`, the paper's objective settings (see the note
            below and `trl_ftis.presets.PRESETS`). It sets only the options not given, and logs once what it set.
            `None`: every `GRPOConfig` default as TRL sets it.
        text_level_peer_rows (`bool`, *optional*, defaults to `False`):
            With `cross_tokenizer`: treat the rows of peers that share this tokenizer as text too (re-tokenised,
            sequence-level weight), as if their tokenizer differed. For measuring what the cross-tokenizer
            approximation costs against token-level F-TIS on the same rows (`benchmarks/ablation.py`); off, they are
            trained on token by token.

    > [!NOTE]
    > Every parameter inherited from [`~trl.GRPOConfig`] keeps TRL's default (TRL 1.16: `loss_type="dapo"`,
    > `beta=0.0`, `disable_dropout=False`, `cast_lm_head_to_fp32=False`), so `FTISConfig` with the flags of a
    > `GRPOConfig` trains what `GRPOTrainer` trains, plus peers. F-TIS is defined for every TRL loss type
    > (`docs/objective.md`, "Every TRL loss"). The paper's settings of those options are one preset,
    > `preset="paper"` (`trl_ftis.presets.PRESETS`):
    > - `loss_type="grpo"`: the paper's aggregation, the mean over completions of each completion's token mean;
    > - `disable_dropout=True`: with dropout on, generation and scoring differ and even a peer's own samples are
    >   off-policy;
    > - `cast_lm_head_to_fp32=True` with `bf16`/`fp16` (off in fp32, where it changes nothing): log-probs are
    >   compared across models, and bf16 noise summed over a completion would push the filter statistic across its
    >   threshold. The trainer turns it off, with a warning, for a LoRA model with tied embeddings, which TRL cannot
    >   cast.
    >
    > The preset sets only the options not given (a value given, TRL's default included, wins) and logs once what
    > it set. A swarm peer in bf16/fp16 without `cast_lm_head_to_fp32` gets one warning at start.

    > [!TIP]
    > `FTISConfig()` is not the paper's full training recipe: the rest of its defaults are TRL's. Where they differ
    > from the paper (Qwen2.5 1.5B/3B on GSM8K):
    > - `num_generations` is `8` (paper: G = 12, 12 prompts per peer and optimizer step);
    > - `top_k` is `0`, no top-k (paper: 50);
    > - `lr_scheduler_type` is `"linear"`, decaying the learning rate to 0 (the paper gives one learning rate, 1e-6,
    >   and no schedule: `"constant"`);
    > - `bf16` is on when `fp16` is not (paper: fp32 weights and Adam states, `bf16=False`);
    > - `max_completion_length` is `512` (paper: about 600).
    >
    > `examples/configs/gsm8k_qwen2.5-1.5b.yaml` (one peer) and `examples/swarms/paper/` (the paper's two-peer
    > pairings) carry the whole recipe.
    """

    variant: str = field(
        default="f-tis",
        metadata={
            # No argparse `choices`: names are normalised (`F_TIS` -> `f-tis`) and checked in __post_init__.
            "help": "Objective variant: 'f-tis' (the method) or an ablation: 'nois', 'vis', 'tis', 'f-nois', 'f-vis' "
            "(case and '_'/'-' insensitive).",
        },
    )
    is_cap: float = field(
        default=2.0,
        metadata={"help": "C, upper bound of the truncated importance weight min(exp(logp - logp_gen), C). >= 1."},
    )
    kl_threshold: float = field(
        default=50.0,
        metadata={
            "help": "g, filter threshold: completions with advantage <= 0 and filter statistic above g get advantage "
            "0."
        },
    )
    kl_reduction: str = field(
        default="group_max_len",
        metadata={
            "help": "Reduction of per-token k3 to the filter statistic: 'group_max_len' (sum / longest completion of "
            "the group), 'mean' or 'sum'.",
            "choices": list(KL_REDUCTIONS),
        },
    )
    filter_mode: str = field(
        default="zero",
        metadata={
            "help": "'zero': a filtered completion's advantage becomes 0 (paper text); 'remove': it leaves the loss "
            "and its normaliser (authors' code).",
            "choices": list(FILTER_MODES),
        },
    )
    kl_threshold_mode: str = field(
        default="fixed",
        metadata={
            "help": "'fixed': g = kl_threshold; 'quantile': g tracks a running quantile of the peer rows' statistic "
            "so that about filter_target_fraction of their negative-advantage rows are filtered.",
            "choices": list(THRESHOLD_MODES),
        },
    )
    filter_target_fraction: float = field(
        default=0.1,
        metadata={
            "help": "kl_threshold_mode='quantile': share of peer negative-advantage rows to filter, in (0, 1). No "
            "effect with 'fixed' (a warning when set to another value there)."
        },
    )
    threshold_momentum: float = field(
        default=0.9,
        metadata={
            "help": "kl_threshold_mode='quantile': weight of the previous threshold in its running average, in "
            "[0, 1). No effect with 'fixed' (a warning when set to another value there)."
        },
    )
    peer_weighting: str = field(
        default="none",
        metadata={
            "help": "'none': peer rows enter the loss as F-TIS weights them; 'ess' (option): each peer's rows' "
            "advantages are also multiplied by that peer's effective sample size fraction in the micro-batch (own "
            "rows unchanged).",
            "choices": list(PEER_WEIGHTINGS),
        },
    )

    peer_id: str | None = field(
        default=None,
        metadata={
            "help": "This peer's name in the swarm (letters, digits, _ . -). Defaults to run_name or 'peer'; "
            "when set, it is also the default run_name (the tracker run is named after the peer)."
        },
    )
    exchange_url: str | None = field(
        default=None,
        metadata={
            "help": "Where peers exchange completions: dir:///path, redis://host:port/db, rediss://..., "
            "memory://name. None: train alone."
        },
    )
    peer_timeout: float = field(
        default=DEFAULT_PEER_TIMEOUT,
        metadata={"help": "Seconds a round waits for the expected peers before training on what arrived."},
    )
    expected_peers: list[str] | None = field(
        default=None,
        metadata={"help": "Peer ids a round waits for (up to peer_timeout); this peer's own id is ignored."},
    )
    num_expected_peers: int | None = field(
        default=None,
        metadata={
            "help": "Alternatively to expected_peers (not both): how many other peers a round waits for (up to "
            "peer_timeout), whatever their ids."
        },
    )
    swarm_secret: str | None = field(
        default=None,
        metadata={
            "help": f"Shared secret signing every message (HMAC). Unset: ${SWARM_SECRET_ENV}, read when the trainer "
            "starts. Never logged."
        },
    )
    max_staleness: int = field(
        default=DEFAULT_MAX_STALENESS,
        metadata={
            "help": "Drop messages from rounds older than current_round - max_staleness (the free mode: more than "
            "max_staleness of their sender's own steps older than its newest message)."
        },
    )
    max_peer_rows: int | None = field(
        default=None,
        metadata={"help": "At most this many peer rows per generation batch (whole groups, shared between peers)."},
    )
    max_peer_ratio: float | None = field(
        default=4.0,
        metadata={"help": "At most this many peer rows per local row in a generation batch (bounds memory)."},
    )
    peer_micro_batch_size: int | None = field(
        default=None,
        metadata={
            "help": "Rows per forward and backward when peer rows enlarge a micro-batch (the same gradient, in "
            "chunks). None: per_device_train_batch_size; 0: the whole micro-batch at once. Not under DeepSpeed, nor "
            "with peer_weighting='ess', kl_threshold_mode='quantile' or top_entropy_quantile < 1."
        },
    )
    trust_peer_rewards: bool = field(
        default=False,
        metadata={
            "help": "Use the rewards peers send instead of recomputing them with this trainer's reward functions."
        },
    )
    require_known_prompts: bool = field(
        default=False,
        metadata={
            "help": "Drop peer rows whose prompt is not in this trainer's training set (rewards then always use local "
            "gold columns, never the sender's)."
        },
    )
    collaboration_mode: str = field(
        default="vertical",
        metadata={
            "help": "'vertical': received groups keep their own normalisation; 'horizontal' (ablation): groups of the "
            "same prompt are normalised together over all models.",
            "choices": list(COLLABORATION_MODES),
        },
    )
    exchange_compact: bool = field(
        default=False,
        metadata={"help": "Send 16-bit log-probs, compressed (fewer bytes); default: exact fp32."},
    )
    max_rounds_ahead: int = field(
        default=DEFAULT_MAX_ROUNDS_AHEAD,
        metadata={"help": "Refuse messages from rounds later than current_round + max_rounds_ahead."},
    )
    max_round_bytes: int = field(
        default=2**30,
        metadata={"help": "At most this many message bytes are read from the exchange per round (all peers)."},
    )
    max_peer_message_rows: int = field(
        default=4096,
        metadata={
            "help": "Completions one peer message may carry; with max_completion_length it bounds every message "
            "(completions up to 4 x max_completion_length tokens). Larger messages are refused unread."
        },
    )
    swarm_name: str | None = field(
        default=None,
        metadata={
            "help": f"The swarm this peer belongs to: messages name it (signed) and must name it. Unset: "
            f"${SWARM_NAME_ENV}, else none."
        },
    )
    swarm_run: str | None = field(
        default=None,
        metadata={
            "help": f"This run of the swarm (a new id per run, the same on every peer): messages of another run "
            f"(replays, leftovers) are refused. Unset: ${SWARM_RUN_ENV}; a peer with an exchange_url and neither "
            "refuses to start. An empty string: no binding, on purpose."
        },
    )
    private_key_file: str | None = field(
        default=None,
        metadata={
            "help": "This peer's Ed25519 private key (PEM, from `trl-ftis keygen`): signs every message. Loaded when "
            "the trainer starts."
        },
    )
    peer_keys_file: str | None = field(
        default=None,
        metadata={
            "help": "The swarm's public keys (peer id -> base64 key, JSON or YAML): only messages signed by the "
            "sender's registered key are accepted. Loaded when the trainer starts."
        },
    )

    exchange_mode: str = field(
        default="sync",
        metadata={
            "help": "'sync': the swarm round runs inside the training step. 'async': a background worker publishes, "
            "collects and admits while the step computes; the rows join the next step (one round of lag). 'free': "
            "never wait for another peer; each step trains on the peer rows that have arrived and are at most "
            "max_staleness of their sender's own steps old.",
            "choices": EXCHANGE_MODE_NAMES,
        },
    )
    gpu_memory_fraction: float | None = field(
        default=None,
        metadata={
            "help": "The share of its GPU's memory this peer may use, in (0, 1]: PyTorch's allocator is capped to it "
            "when the trainer starts, so that peers sharing a GPU cannot starve each other (the launcher's "
            "`gpu_share` sets it). None: no cap."
        },
    )
    cross_tokenizer: bool = field(
        default=False,
        metadata={
            "help": "Accept peers with another tokenizer: their completion texts are re-tokenised and trained on with "
            "a sequence-level truncated weight and filter. Also sends this peer's completion texts."
        },
    )
    text_level_peer_rows: bool = field(
        default=False,
        metadata={
            "help": "With cross_tokenizer: treat rows of peers sharing this tokenizer as text too (sequence-level "
            "weight), to measure what the cross-tokenizer approximation costs."
        },
    )

    preset: str | None = field(
        default=None,
        metadata={
            "help": "A named set of TRL options to start from: 'paper' (the paper's objective settings: "
            "loss_type='grpo', disable_dropout=True, cast_lm_head_to_fp32 with bf16/fp16; see PRESETS). It sets "
            "only the options not given, and logs what it set. Default: none, every GRPOConfig default as TRL sets "
            "it.",
        },
    )

    # TRL's options a preset may set: `None` means "not given", resolved in `__post_init__` to the preset's value or
    # TRL's default, so that a value given (TRL's default included) always wins over the preset.
    loss_type: str | None = field(
        default=None,
        metadata={
            "help": "TRL's loss ('dapo', 'grpo', 'dr_grpo', 'bnpo', 'cispo', 'sapo', 'luspo', 'vespo'); F-TIS works "
            "with each. Default: TRL's ('dapo'), or the preset's ('paper': 'grpo').",
        },
    )
    disable_dropout: bool | None = field(
        default=None,
        metadata={"help": "Disable dropout in the model. Default: TRL's (False), or the preset's ('paper': True)."},
    )
    cast_lm_head_to_fp32: bool | None = field(
        default=None,
        metadata={
            "help": "Compute the LM head in fp32 (untied embeddings only). Default: TRL's (False), or the preset's "
            "('paper': on with bf16/fp16)."
        },
    )

    def __post_init__(self):
        check_preset(self.preset)
        changed = resolve_preset_options(self, ("loss_type", "disable_dropout"))
        super().__post_init__()
        # After TRL's set-up, which decides `bf16` (on unless fp16), on which the preset's fp32 head depends.
        changed += resolve_preset_options(self, ("cast_lm_head_to_fp32",))
        say_what_the_preset_set(self.preset, changed)
        check_ftis_fields(self)

    @classmethod
    def from_grpo_config(cls, config: GRPOConfig) -> FTISConfig:
        """
        An `FTISConfig` that holds every value of `config`, a TRL `GRPOConfig` (validated when it was built), and the
        defaults of the F-TIS fields, so that `FTISTrainer(..., args=GRPOConfig(...))` runs what the `GRPOConfig`
        says.

        No preset is applied: a drop-in replacement trains with the settings it was given. `config` is not
        changed.

        How: a new `FTISConfig` is created without running the dataclass constructor (`object.__new__`), every
        attribute of `config` is copied into it as it is (shallowly, like `copy.copy`: every field, including what
        `GRPOConfig.__post_init__` derived, such as `generation_batch_size` and `steps_per_generation`, and the state
        `TrainingArguments.__post_init__` set besides its fields, such as `distributed_state`), then each F-TIS field
        gets its default and the F-TIS checks run. The constructor is not called with `config`'s values because
        `GRPOConfig.__post_init__` refuses some of its own derived fields given together (`generation_batch_size`
        with `steps_per_generation`), and would run TRL's and transformers' set-up a second time.
        """
        if not isinstance(config, GRPOConfig):
            raise TypeError(f"from_grpo_config takes a trl.GRPOConfig, got {type(config).__name__}.")
        converted = object.__new__(cls)
        for name, value in vars(config).items():  # every GRPOConfig value, as __post_init__ left it
            setattr(converted, name, value)
        inherited = {f.name for f in dataclasses.fields(GRPOConfig)}
        for f in dataclasses.fields(cls):
            if f.name not in inherited:
                default = f.default_factory() if f.default is dataclasses.MISSING else f.default
                setattr(converted, f.name, copy.deepcopy(default))
        check_ftis_fields(converted)
        return converted
