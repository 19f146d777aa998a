"""The checks `FTISConfig` runs on its own fields once TRL's `GRPOConfig.__post_init__` has run: the objective's
([`check_objective_fields`]) and the swarm's ([`check_swarm_fields`]), which also complete a few (the canonical
variant name, the peer id, the normalised exchange URL, expanded key paths). Each raises `ValueError` naming the field
and what it takes; an option that has no effect in the chosen mode gets a warning instead.

The choices of a few fields ([`COLLABORATION_MODES`], [`PEER_WEIGHTINGS`]) are here too: the fields' `choices` and
their checks read the same tuple.
"""

from __future__ import annotations

import dataclasses
import logging
import numbers
import os
from typing import Any

from .exchange.transports.registry import normalise_exchange_url
from .exchange_mode_registry import EXCHANGE_MODES
from .message_trust import binding_problem
from .objective import (
    FILTER_MODES,
    IMPORTANCE_SAMPLING_LEVELS,
    KL_REDUCTIONS,
    LOSS_TYPES,
    THRESHOLD_MODES,
    parse_variant,
)
from .peer_ids import check_peer_id, is_peer_id
from .presets import warn_once
from .round_window import check_expected_peers, check_round_window
from .sampling_bounds import check_temperature

logger = logging.getLogger(__name__)

COLLABORATION_MODES = ("vertical", "horizontal")
# How peer rows weigh against own rows in the loss: as F-TIS weights them, or also by their source's ESS fraction.
PEER_WEIGHTINGS = ("none", "ess")


def check_ftis_fields(config: Any) -> None:
    """Every check of this module on `config`, an `FTISConfig` whose `GRPOConfig.__post_init__` has run."""
    check_objective_fields(config)
    check_swarm_fields(config)


def check_objective_fields(config: Any) -> None:
    """Checks (and completes: `variant` becomes its canonical name) the objective's fields of `config`."""
    config.variant = parse_variant(config.variant).name  # raises ValueError on an unknown name
    if not config.is_cap >= 1.0:  # also rejects NaN
        raise ValueError(
            f"is_cap must be a number >= 1.0 (the weight of an on-policy token is 1), got {config.is_cap}."
        )
    if not config.kl_threshold >= 0.0:
        raise ValueError(f"kl_threshold must be a number >= 0, got {config.kl_threshold}.")
    if config.kl_reduction not in KL_REDUCTIONS:
        raise ValueError(f"Unknown kl_reduction {config.kl_reduction!r}; expected one of {', '.join(KL_REDUCTIONS)}.")
    if config.filter_mode not in FILTER_MODES:
        raise ValueError(f"Unknown filter_mode {config.filter_mode!r}; expected one of {', '.join(FILTER_MODES)}.")
    if config.kl_threshold_mode not in THRESHOLD_MODES:
        raise ValueError(
            f"Unknown kl_threshold_mode {config.kl_threshold_mode!r}; expected one of {', '.join(THRESHOLD_MODES)}."
        )
    if not 0.0 < config.filter_target_fraction < 1.0:
        raise ValueError(f"filter_target_fraction must be in (0, 1), got {config.filter_target_fraction}.")
    if not 0.0 <= config.threshold_momentum < 1.0:
        raise ValueError(f"threshold_momentum must be in [0, 1), got {config.threshold_momentum}.")
    if config.kl_threshold_mode == "fixed":
        warn_about_ignored_quantile_fields(config)
    if config.peer_weighting not in PEER_WEIGHTINGS:
        raise ValueError(f"peer_weighting must be one of {', '.join(PEER_WEIGHTINGS)}, got {config.peer_weighting!r}.")
    if config.loss_type not in LOSS_TYPES:
        raise ValueError(f"Unknown loss_type {config.loss_type!r}; expected one of {', '.join(LOSS_TYPES)}.")
    if config.importance_sampling_level not in IMPORTANCE_SAMPLING_LEVELS:
        raise ValueError(
            f"Unknown importance_sampling_level {config.importance_sampling_level!r}; expected one of "
            f"{', '.join(IMPORTANCE_SAMPLING_LEVELS)}."
        )
    check_temperature(config.temperature)  # also rejects NaN


def warn_about_ignored_quantile_fields(config: Any) -> None:
    """With `kl_threshold_mode="fixed"` the quantile threshold's fields have no effect: a warning for each one
    set to another value than its default (the default cannot be told apart from not setting it)."""
    defaults = {f.name: f.default for f in dataclasses.fields(config)}
    for name in ("filter_target_fraction", "threshold_momentum"):
        if getattr(config, name) != defaults[name]:
            logger.warning(
                "%s=%r has no effect with kl_threshold_mode='fixed' (only the quantile threshold uses it); set "
                "kl_threshold_mode='quantile' to use it, or leave it at its default %r.",
                name,
                getattr(config, name),
                defaults[name],
            )


def check_swarm_fields(config: Any) -> None:
    """Checks the swarm's fields of `config` and completes some: the peer id (from `run_name`, and `run_name` from
    it), the exchange URL (normalised), the key files' paths (`~` expanded; the files are read later, by
    `FTISConfig.swarm_credentials`)."""
    if config.peer_id is None:
        config.peer_id = config.run_name if is_peer_id(config.run_name) else "peer"
    elif config.run_name is None:
        # Trackers (wandb, trackio, ...) name the run after `run_name`: one run per peer, named after it.
        config.run_name = config.peer_id
    check_peer_id(config.peer_id, "peer_id")
    if config.exchange_url is not None:
        config.exchange_url = normalise_exchange_url(config.exchange_url)
        if (config.bf16 or config.fp16) and not config.cast_lm_head_to_fp32:
            warn_once(
                logger,
                "lm_head_fp32",
                "cast_lm_head_to_fp32 is off (TRL's default) in %s: peers compare log-probs across models, and "
                "half-precision noise summed over a completion moves the filter statistic. Set "
                "cast_lm_head_to_fp32=True (or preset='paper') unless this is what you measure.",
                "bf16" if config.bf16 else "fp16",
            )
    if not config.peer_timeout >= 0:
        raise ValueError(f"peer_timeout must be >= 0 seconds, got {config.peer_timeout}.")
    for peer in config.expected_peers or []:
        check_peer_id(peer, "expected_peers")
    check_expected_peers(config.expected_peers, config.num_expected_peers)  # alternatives, never both
    check_round_window(config.max_staleness, config.max_rounds_ahead)
    for name in ("swarm_name", "swarm_run"):
        value = getattr(config, name)
        problem = None if value is None or (name == "swarm_run" and value == "") else binding_problem(value)
        if problem is not None:
            raise ValueError(f"{name} {problem}.")
    if config.max_round_bytes < 1:
        raise ValueError(f"max_round_bytes must be >= 1, got {config.max_round_bytes}.")
    if config.max_peer_message_rows < 1:
        raise ValueError(f"max_peer_message_rows must be >= 1, got {config.max_peer_message_rows}.")
    if config.max_peer_rows is not None and config.max_peer_rows < 0:
        raise ValueError(f"max_peer_rows must be >= 0, got {config.max_peer_rows}.")
    if config.max_peer_ratio is not None and not config.max_peer_ratio >= 0:
        raise ValueError(f"max_peer_ratio must be >= 0, got {config.max_peer_ratio}.")
    size = config.peer_micro_batch_size  # whole rows, as max_staleness (a fraction fails the chunked loss mid-step)
    if size is not None and (isinstance(size, bool) or not isinstance(size, numbers.Integral) or size < 0):
        raise ValueError(f"peer_micro_batch_size must be >= 0 (0: no chunks) and a whole number, got {size!r}.")
    if config.collaboration_mode not in COLLABORATION_MODES:
        raise ValueError(
            f"collaboration_mode must be one of {', '.join(COLLABORATION_MODES)}, got {config.collaboration_mode!r}."
        )
    if config.exchange_mode not in EXCHANGE_MODES:
        raise ValueError(
            f"exchange_mode must be one of {', '.join(map(repr, EXCHANGE_MODES))}, got {config.exchange_mode!r}."
        )
    if config.collaboration_mode == "horizontal" and not EXCHANGE_MODES[config.exchange_mode].horizontal:
        raise ValueError(
            f"exchange_mode={config.exchange_mode!r} cannot be combined with collaboration_mode='horizontal': "
            "horizontal mode normalises this step's own rows together with the same round's peer rows, which "
            "only a mode that collects at the step has (sync). Use exchange_mode='sync', or the vertical mode."
        )
    if config.gpu_memory_fraction is not None and not 0 < config.gpu_memory_fraction <= 1:  # also rejects NaN
        raise ValueError(f"gpu_memory_fraction must be a fraction in (0, 1], got {config.gpu_memory_fraction}.")
    if config.text_level_peer_rows and not config.cross_tokenizer:
        raise ValueError("text_level_peer_rows=True needs cross_tokenizer=True (it treats peer rows as text).")
    for name in ("private_key_file", "peer_keys_file"):  # paths only: the files are read by swarm_credentials()
        value = getattr(config, name)
        if value is not None:
            setattr(config, name, os.path.expanduser(os.fspath(value)))
