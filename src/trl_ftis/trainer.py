"""`FTISTrainer`: TRL's `GRPOTrainer` with the F-TIS objective and peer rows from other models.

The trainer is composed, like TRL's own async GRPO trainer: it keeps only the overrides of TRL's hooks and the glue
between them, and owns the objects that own everything else, each with explicit dependencies and testable without a
trainer:

* [`PeerRowLedger`] (`trl_ftis.swarm.ledger`): every count about peer rows, their warn-once bookkeeping, the per-step
  row-count metrics and their checkpoint state;
* [`Admission`] (`trl_ftis.swarm.admission`): received rows in, [`AdmittedRow`]s out (or dropped and counted),
  rescoring with a [`RewardScorer`] (`trl_ftis.swarm.scoring`), the last statistics check;
* [`RoundRunner`] (`trl_ftis.swarm.rounds`): the swarm round on the main process, run as its exchange mode
  (`trl_ftis.swarm.exchange_modes`) runs it, and the lock a background worker shares with the training loop;
* [`PeerMerge`] (`trl_ftis.peer_merge`): admitted peer rows into TRL's batch, the same count on every process;
* [`ExchangeStep`] (`trl_ftis.exchange_step`): own rows out and the swarm's accepted rows in at a training
  generation, the same collectives on every process;
* [`FTISLossHook`] (`trl_ftis.loss_hook`): the F-TIS terms written into the batch TRL's loss reads, and their
  statistics;
* the [`Swarm`] client (`trl_ftis.swarm.client`), connected with the credentials the config reads once, before the
  model is loaded.

The checkpoint hooks save and restore what these owners hand over (`trl_ftis.swarm.checkpoint`). The TRL methods
overridden here, and why: `trl_ftis.trl_seams`.
"""

from __future__ import annotations

import logging
import os
import textwrap
from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any, ClassVar

import torch
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl import GRPOConfig, GRPOTrainer
from trl.models.utils import disable_gradient_checkpointing
from trl.trainer.utils import get_config_model_id, use_adapter

from .collaboration_report import collaboration_report
from .config import FTISConfig
from .console import apply_console_env
from .credentials import SwarmCredentials
from .exchange_step import ExchangeStep
from .generator_logps import (
    GeneratorLogpsRecorder,
    generate_with,
    records_raw_logits,
    sampling_warpers,
    ties_embeddings,
)
from .gpu_share import cap_gpu_memory
from .loss_hook import FTISLossHook
from .micro_batches import chunk_size, chunked_loss
from .model_card import ModelCardAtEndCallback, add_ftis_section, card_results
from .multi_turn import MULTI_TURN_REFUSAL
from .own_rows import (
    build_own_rows,
    completion_lengths,
    completion_texts,
    generator_logps,
    sampling_settings,
    unmasked_completions,
)
from .peer_inbox import PeerInbox
from .peer_merge import PeerMerge
from .peer_rows import (
    AdmittedRow,
    PeerRow,
    checked_rows,
)
from .peer_summary import peer_summary
from .peer_value import PeerValue
from .step_clock import StepClock, StepClockCallback
from .summary_file import SummaryCallback
from .swarm import (
    DROP_REASONS,
    STRIP_REASONS,
    Admission,
    PeerRowLedger,
    RewardScorer,
    RoundRunner,
    StateCheckpoints,
    Swarm,
    connect_swarm,
    resolve_resume,
)

logger = logging.getLogger(__name__)

RowListener = Callable[[list[PeerRow]], None]


class FTISTrainer(GRPOTrainer):
    """
    Trainer for GRPO with Filtered Truncated Importance Sampling (F-TIS), for training on completions sampled by other
    models.

    F-TIS ("F-TIS: Harnessing Diverse Models in Collaborative GRPO", arXiv 2605.22537) lets peers that train different
    models on one task share their sampled completions. A drop-in replacement for [`~trl.GRPOTrainer`]: same
    constructor, same features (PEFT, gradient accumulation, `num_iterations`, vLLM, logging, saving, `push_to_hub`).
    Two things change:

    * The loss is the F-TIS objective (`trl_ftis.objective`): each token's advantage is multiplied by the truncated
      importance weight `min(exp(ℓθ - ℓgen), C)` (stop-gradient) and negative-advantage completions whose filter
      statistic exceeds `kl_threshold` get advantage 0. For the trainer's own rows `ℓgen = ℓold`, so with no peer
      rows it trains exactly like `GRPOTrainer` with the same config. It works with every TRL `loss_type` and
      with `importance_sampling_level="sequence"` (GSPO: one weight and one statistic per completion), since each
      of TRL's losses is linear in the advantage (`docs/objective.md`, "Every TRL loss").
    * Peer rows (completions sampled by other models that share this model's tokenizer) join the next generation
      batch, with advantages normalised within their own group: added with [`add_peer_rows`], or received from a swarm
      (`exchange_url`). [`add_row_listener`] hands out this trainer's own rows (with their generator log-probs) in the
      same format.

    The hooks of [`~trl.GRPOTrainer`] it overrides, and why: `trl_ftis.trl_seams` (`docs/api.md`, "How FTISTrainer
    hooks into TRL").

    Metrics are logged under `ftis/own/...` and `ftis/peer/...`: `filtered_frac` (completions whose advantage the
    filter zeroed), `is_weight_mean`/`is_weight_max`/`is_weight_capped_frac` (the truncated weight, per token),
    `kl_mean`/`kl_max` (the filter statistic `D`, finite values) and `kl_nonfinite_frac`, plus `ftis/peer_rows`.

    Args:
        model (`str` or [`~transformers.PreTrainedModel`] or [`~peft.PeftModel`]):
            As for [`~trl.GRPOTrainer`].
        reward_funcs (`RewardFunc` or `list[RewardFunc]`, *optional*):
            As for [`~trl.GRPOTrainer`]; they also rescore received rows unless `trust_peer_rewards`.
        args ([`FTISConfig`], *optional*):
            The configuration. A TRL `GRPOConfig` is converted with [`FTISConfig.from_grpo_config`] (its values, and
            the F-TIS fields at their defaults). Defaults to `FTISConfig("<model name>-FTIS")`.
        train_dataset, eval_dataset, processing_class, reward_processing_classes, callbacks, optimizers,
        quantization_config, peft_config, tools, rollout_func, environment_factory:
            As for [`~trl.GRPOTrainer`]: the same parameters in the same order with the same defaults.
    """

    _tag_names: ClassVar[list[str]] = ["trl", "grpo", "ftis"]
    _clock: StepClock = StepClock()  # replaced in __init__; TRL's own tests call methods of trainers built without it
    _name = "F-TIS"
    _paper: ClassVar[dict[str, str]] = {
        "title": "F-TIS: Harnessing Diverse Models in Collaborative GRPO",
        "id": "2605.22537",
        # docstyle-ignore
        "citation": textwrap.dedent("""\
            @article{blagoev2026ftis,
                title        = {{F-TIS: Harnessing Diverse Models in Collaborative GRPO}},
                author       = {Nikolay Blagoev and O{\\u{g}}uzhan Ersoy and Wendelin Boehmer and Lydia Yiyu Chen},
                year         = 2026,
                eprint       = {arXiv:2605.22537}
            }"""),
    }

    def __init__(
        self,
        model,
        reward_funcs=None,
        args: FTISConfig | None = None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        reward_processing_classes=None,
        callbacks=None,
        optimizers=(None, None),
        quantization_config=None,
        peft_config=None,
        tools=None,
        rollout_func=None,
        environment_factory=None,
    ):
        # The same parameters, in the same order and with the same defaults, as GRPOTrainer.__init__ (TRL 1.16):
        # tests/core/test_trainer.py checks it, so positional calls written for GRPOTrainer mean the same here.
        if args is None:
            model_name = model if isinstance(model, str) else get_config_model_id(model.config)
            args = FTISConfig(f"{model_name.split('/')[-1]}-FTIS")
        elif not isinstance(args, FTISConfig):
            if not isinstance(args, GRPOConfig):
                raise TypeError(
                    f"FTISTrainer needs an FTISConfig (or a trl.GRPOConfig), got {type(args).__name__}: "
                    "`trl_ftis.FTISConfig(...)` takes every GRPOConfig argument and the F-TIS options."
                )
            # A drop-in replacement: the GRPOConfig's values, F-TIS's defaults for the F-TIS fields.
            logger.info("Converting the GRPOConfig to an FTISConfig (F-TIS fields at their defaults).")
            args = FTISConfig.from_grpo_config(args)
        self._ledger = PeerRowLedger(DROP_REASONS, STRIP_REASONS)
        self._row_listeners: list[RowListener] = []
        self._recorder: GeneratorLogpsRecorder | None = None
        self._recorded_logps: list[list[float]] | None = None
        self.logps_source = "trainer"  # what the last own rows' generator log-probs are (`own_rows.LOGPS_SOURCES`)
        self._last_rewards_per_func: torch.Tensor | None = None
        self._clock = StepClock()  # where each optimizer step's time goes (`ftis/time/...`)
        self._value = PeerValue()  # what reached the loss, per source, and the weight it carried
        self._batch_seconds = 0.0  # time making generation batches, which `training_step` subtracts from its own
        # Read once, before the model is loaded: a wrong key file fails now, naming it.
        credentials = args.swarm_credentials() if args.exchange_url is not None else None
        if args.cast_lm_head_to_fp32 and peft_config is not None and ties_embeddings(model):
            # TRL 1.16 casts a tied LM head through `model.model.embed_tokens`, which a PEFT wrapper does not have.
            logger.warning(
                "cast_lm_head_to_fp32 is not supported by TRL for a LoRA model with tied embeddings; turning it off. "
                "bf16 log-probs are then a little noisier (docs/getting-started.md, 'bf16 and the fp32 LM head')."
            )
            args.cast_lm_head_to_fp32 = False
        if args.exchange_url is not None and (tools or environment_factory):
            raise ValueError(MULTI_TURN_REFUSAL.format("exchange_url"))
        if args.gpu_memory_fraction is not None:
            cap_gpu_memory(args.gpu_memory_fraction, args)
        super().__init__(
            model,
            reward_funcs,
            args=args,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            reward_processing_classes=reward_processing_classes,
            callbacks=callbacks,
            optimizers=optimizers,
            quantization_config=quantization_config,
            peft_config=peft_config,
            tools=tools,
            rollout_func=rollout_func,
            environment_factory=environment_factory,
        )
        self._clock.synchronize = torch.cuda.synchronize if self.accelerator.device.type == "cuda" else None  # async
        swarm = None
        if args.exchange_url is not None and self.accelerator.is_main_process:
            swarm = self._connect_swarm(args, credentials)
        self._scorer = RewardScorer(
            tokenizer=self._tokenizer,
            reward_funcs=self.reward_funcs,
            reward_processing_classes=self.reward_processing_classes,
            reward_func_names=self.reward_func_names,
            reward_weights=self.reward_weights,
            chat_template_kwargs=self.chat_template_kwargs,
            trainer_state=lambda: self.state,
            event_loop=lambda: getattr(self, "async_loop", None),
        )
        eos = self._tokenizer.eos_token_id
        if eos is None and self.eos_token_ids:  # the model's end of sequence, when the tokenizer names none
            eos = self.eos_token_ids[0]
        self._admission = Admission(
            config=args,
            tokenizer=self._tokenizer,
            render=self._render_prompt_batch,
            ledger=self._ledger,
            vocab_limit=self.vocab_limit,
            context_length=self._context_length(),
            has_chat_template=any(
                getattr(owner, "chat_template", None) for owner in (self, self.processing_class, self._tokenizer)
            ),
            eos_token_id=eos,
            stop_token_ids=self.eos_token_ids,
            scorer=self._scorer,
            dataset=self.train_dataset,
        )
        self._rounds = RoundRunner(
            config=args, swarm=swarm, admission=self._admission, ledger=self._ledger, scale_rewards=self.scale_rewards
        )
        self._inbox = PeerInbox(  # the rows of add_peer_rows
            admission=self._admission,
            ledger=self._ledger,
            lock=self._rounds.lock,
            vocab_limit=self.vocab_limit,
            cross_tokenizer=args.cross_tokenizer,
            bound=lambda: self._rounds.queue_rows(args.generation_batch_size),
        )
        self._checkpoints = StateCheckpoints(
            config=args,
            ledger=self._ledger,
            inbox=self._inbox,
            rounds=self._rounds,
            clock=self._clock,
            value=self._value,
            accelerator=self.accelerator,
        )
        self._loss_hook = FTISLossHook(
            args,
            accelerator=self.accelerator,
            ledger=self._ledger,
            value=self._value,
            metrics=self._metrics,
            training=lambda: self.model.training,
            loss_type=self.loss_type,
            importance_sampling_level=self.importance_sampling_level,
        )
        self._merge = PeerMerge(
            accelerator=self.accelerator,
            admission=self._admission,
            ledger=self._ledger,
            value=self._value,
            lock=self._rounds.lock,
            log=lambda name, value: self._metrics["train"][name].append(value),
            completion_logps=lambda batch, rows: self._completion_logps(self.model, batch, rows),
            reference_logps=self._reference_logps,
            scale_rewards=self.scale_rewards,
            steps_per_generation=args.steps_per_generation,
            pad_token_id=self._tokenizer.pad_token_id,
            vllm_importance_sampling_mode=self.vllm_importance_sampling_mode,
            truncation_ends={*self.eos_token_ids, self._tokenizer.pad_token_id}
            if self.mask_truncated_completions
            else None,
        )
        self._exchange = ExchangeStep(
            accelerator=self.accelerator,
            rounds=self._rounds,
            merge=self._merge,
            log=lambda name, value: self._metrics["train"][name].append(value),
            sampling=lambda: sampling_settings(self.logps_source, self.top_k, self.top_p, self.min_p),
        )
        # The clock first: a held-out evaluation inserted before the summary then runs after the step is closed.
        self.add_callback(
            StepClockCallback(self._clock, lambda name, value: self._metrics["train"][name].append(value))
        )
        self.add_callback(SummaryCallback(self.summary, self.accelerator.is_main_process))
        self.add_callback(ModelCardAtEndCallback(self.create_model_card))
        apply_console_env(self)  # the launcher's peers: one line a step, no dependency deprecation notices

    @property
    def swarm(self) -> Swarm | None:
        """The main process's [`Swarm`] client (with `exchange_url`), which the round runner uses; else `None`."""
        return self._rounds.swarm

    @swarm.setter
    def swarm(self, swarm: Swarm | None) -> None:
        self._rounds.swarm = swarm

    def _connect_swarm(self, args: FTISConfig, credentials: SwarmCredentials) -> Swarm:
        """The main process's [`Swarm`] client (`trl_ftis.swarm.rounds.connect_swarm`)."""
        return connect_swarm(
            args,
            credentials,
            tokenizer=self._tokenizer,
            vocab_limit=self.vocab_limit,
            temperature=self.temperature,
            reward_names=self.reward_func_names,
            model_name=self._model_name(),
        )

    def _render_prompt_batch(self, prompts: list[Any]) -> list[list[int]]:
        """Prompts of one kind rendered and tokenized as TRL renders this trainer's own (the admission's
        `PromptRenderer`); raises for prompts with images."""
        ids, images, _ = self._tokenize_prompts(prompts)
        if images is not None:
            raise ValueError("peer rows with images are not supported")
        return ids

    def _context_length(self) -> int | None:
        """The model's context (`max_position_embeddings` of its text config), when it has one."""
        config = self.accelerator.unwrap_model(self.model).config
        config = config.get_text_config() if hasattr(config, "get_text_config") else config
        length = getattr(config, "max_position_embeddings", None)
        return length if isinstance(length, int) and length > 0 else None

    def _model_name(self) -> str:
        """This peer's model as other peers and the model card name it (the base model's id or path)."""
        model = self.accelerator.unwrap_model(self.model)
        # A model built in code has no id: say what it is rather than only its class.
        built = f"a {type(model).__name__} built locally ({model.num_parameters() / 1e6:.2f}M parameters)"
        name = get_config_model_id(model.config) or built
        return f"{name} (LoRA)" if hasattr(model, "peft_config") else name

    # ------------------------------------------------------------------------------------------------------------
    # Public API: peer rows in, own rows out
    # ------------------------------------------------------------------------------------------------------------
    @property
    def vocab_limit(self) -> int:
        """Token ids must be below this: the smaller of the tokenizer's size and the input embedding's rows."""
        embeddings = self.accelerator.unwrap_model(self.model).get_input_embeddings()
        return min(len(self._tokenizer), embeddings.num_embeddings)

    def add_peer_rows(self, rows: Iterable[PeerRow]) -> int:
        """
        Queue completions sampled by other models; they join the next generation batch of this trainer.

        Programming errors raise before anything is queued: a row that is not a [`PeerRow`], has fields of the
        wrong types, or a field that cannot be pickled (`TypeError`, naming the row and the field: a multi-process job
        gathers the rows with pickle, so every process count checks it); completion ids outside the local vocabulary
        and embedding, or generator log-probs that are not finite and <= 0 (`ValueError`). Well-formed rows that
        cannot be trained on go through the same admission as rows received from a swarm: dropped, counted
        (`ftis/peer_rows_dropped/<reason>`) and warned about once per sender and reason (`docs/swarm.md`, "Hostile
        and mismatched rows"). Rows in another tokenizer's tokens (`foreign_tokenizer=True`) need
        `cross_tokenizer=True` (else `ValueError`) and are re-tokenised from their `completion_text`.

        Rewards are used as given; advantages are normalised within each `(sender, group)` of the rows merged
        together (the rows themselves are never changed: the trainer queues admitted copies). At most 4 steps' worth
        are queued (beyond: dropped, `queue_full`); a step merges at most its peer-row cap, as whole groups. In a
        multi-process job the rows added on every process are gathered and shared out evenly, as a swarm's are.

        Args:
            rows (`Iterable[PeerRow]`):
                The completions, as [`PeerRow`]s.

        Returns:
            `int`: the number of rows queued.
        """
        if self.tools or self.environment_factories:
            raise ValueError(MULTI_TURN_REFUSAL.format("add_peer_rows"))
        return self._inbox.add(checked_rows(rows))  # all checked before any is queued: all of the call's rows or none

    @property
    def num_pending_peer_rows(self) -> int:
        """Peer rows queued for the next generation batch."""
        return len(self._inbox)

    def score_rows(self, rows: Sequence[PeerRow]) -> list[tuple[float, dict[str, float]]]:
        """
        Score rows with this trainer's reward functions, on the calling process only (no collectives); how this
        differs from TRL's `_calculate_rewards` is listed in `trl_ftis.swarm.scoring.RewardScorer`.

        Args:
            rows (`Sequence[PeerRow]`):
                The rows to score.

        Returns:
            `list[tuple[float, dict[str, float]]]`: per row, the weighted total and the reward of each function, by
            name.
        """
        return self._scorer.score_rows(rows)

    def add_row_listener(self, listener: RowListener) -> None:
        """
        Call `listener(rows)` with this process's own freshly generated rows at every training generation, after
        scoring.

        The rows carry the generator log-probs, computed only while a listener is registered: from the generation pass
        itself when `generate` exposes raw logits, else by reusing the batch-time log-probs or one no-grad forward.
        This is what an exchange publishes to other peers.

        Args:
            listener (`Callable[[list[PeerRow]], None]`):
                Called with a list of [`PeerRow`]s.
        """
        if self.tools or self.environment_factories:
            raise ValueError(MULTI_TURN_REFUSAL.format("add_row_listener"))
        self._row_listeners.append(listener)

    # ------------------------------------------------------------------------------------------------------------
    # Generation: record own generator log-probs when someone listens
    # ------------------------------------------------------------------------------------------------------------
    def _generate(self, prompts: list):
        with self._clock.measure("generation"):
            return super()._generate(prompts)

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        recorder = self._recorder
        if recorder is None or self.use_vllm or self.use_transformers_continuous_batching or self.tools:
            return super()._generate_single_turn(
                prompt_ids, images, multimodal_fields, num_generations, has_tool_images
            )
        with generate_with(self.accelerator.unwrap_model(self.model_wrapped), recorder) as recorded:
            completion_ids, logprobs = super()._generate_single_turn(
                prompt_ids, images, multimodal_fields, num_generations, has_tool_images
            )
        per_token = recorded["logps"]
        self._recorded_logps = [per_token[i, : len(ids)].tolist() for i, ids in enumerate(completion_ids)]
        return completion_ids, logprobs

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        # TRL does not keep raw rewards in the batch; the rows handed to listeners need them.
        with self._clock.measure("scoring"):
            rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._last_rewards_per_func = rewards_per_func
        return rewards_per_func

    # ------------------------------------------------------------------------------------------------------------
    # Batch formation: F-TIS fields, own rows out, peer rows in
    # ------------------------------------------------------------------------------------------------------------
    def _generate_and_score_completions(self, inputs):
        start = self._clock.now()
        try:
            return self._generation_batch(inputs)
        finally:
            self._batch_seconds += self._clock.now() - start

    def _generation_batch(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        """TRL's generation batch, plus the F-TIS fields, with this step's peer rows merged in; own rows handed to
        the listeners and, in a swarm, to the round."""
        mode = "train" if self.model.training else "eval"
        in_swarm = mode == "train" and self.args.exchange_url is not None
        listening = mode == "train" and (bool(self._row_listeners) or in_swarm)
        can_record = (
            listening
            and not self.use_vllm
            and not self.use_transformers_continuous_batching
            and records_raw_logits(self.generation_config)
        )
        warpers = sampling_warpers(self.generation_config) if can_record else None  # what `generate` samples from
        self._recorder = GeneratorLogpsRecorder(self.temperature, warpers) if can_record else None
        self._recorded_logps = None
        try:
            with self._rounds.turn():  # TRL's tokenizer and reward functions, which an async worker also uses
                output = super()._generate_and_score_completions(inputs)
        finally:
            self._recorder = None

        num_generations = self.num_generations if mode == "train" else self.num_generations_eval
        output = self._merge.own_fields(output, num_generations)
        if mode != "train":
            return output
        own_rows = self._own_rows(inputs, output, num_generations) if listening else []
        for listener in self._row_listeners:
            listener(own_rows)
        rows = self._inbox.take(self._rounds.peer_row_cap(len(inputs)))
        if in_swarm:
            with self._clock.measure("exchange"):
                rows = rows + self._exchange.run(own_rows, output, self.state.global_step)
        with self._rounds.turn():
            return self._merge_peer_rows(output, rows)

    @torch.no_grad()
    def _completion_logps(self, model, batch: dict[str, Any], rows: slice | None = None) -> torch.Tensor:
        """Teacher-forced per-token log-probs (at the sampling temperature, fp32 head) of `batch`'s completions."""
        rows = rows or slice(None)
        prompt_ids, completion_ids = batch["prompt_ids"][rows], batch["completion_ids"][rows]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([batch["prompt_mask"][rows], batch["completion_mask"][rows]], dim=1)
        with disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
            logps, _, _ = GRPOTrainer._get_per_token_logps_and_entropies(
                self,
                model,
                input_ids,
                attention_mask,
                completion_ids.size(1),
                batch_size=self.args.per_device_train_batch_size,
            )
        return logps.float()

    def _own_rows(self, inputs: list[dict[str, Any]], output: dict[str, Any], num_generations: int) -> list[PeerRow]:
        """This process's freshly scored rows as `PeerRow`s, with generator log-probs and rewards."""
        batch, pad = output["completion_ids"].shape[0], self._tokenizer.pad_token_id
        lengths = completion_lengths(output["completion_ids"], output["completion_mask"], pad)
        # TRL's batch-time log-probs of the current model are the generator's, unless it masked a truncated
        # completion out (its attention too): then the tokens are scored again.
        old = output.get("old_per_token_logps")
        logps, self.logps_source = generator_logps(
            lengths,
            recorded=self._recorded_logps,
            sampler=output.get("sampling_per_token_logps"),
            scored=lambda: (
                old
                if old is not None and lengths == output["completion_mask"].sum(-1).tolist()
                else self._completion_logps(self.model, unmasked_completions(output, lengths))
            ),
        )
        ids = [row[:n] for row, n in zip(output["completion_ids"].tolist(), lengths, strict=True)]
        start = self.accelerator.process_index * batch
        return build_own_rows(
            inputs,
            ids,
            logps,
            self._last_rewards_per_func[start : start + batch],
            self.reward_weights,
            self.reward_func_names,
            sender=self.args.peer_id,
            step=self.state.global_step,
            first_index=start,
            num_generations=num_generations,
            texts=completion_texts(self._tokenizer, ids, self.eos_token_ids) if self.args.cross_tokenizer else None,
        )

    def _merge_peer_rows(self, output: dict[str, Any], rows: Sequence[AdmittedRow]) -> dict[str, Any]:
        return self._merge.merge(output, rows)  # `trl_ftis.peer_merge.PeerMerge`

    def _reference_logps(self, batch: dict[str, Any], rows: slice) -> torch.Tensor:
        if self.ref_model is not None:
            return self._completion_logps(self.ref_model, batch, rows)
        model = self.accelerator.unwrap_model(self.model)
        adapter = "ref" if "ref" in getattr(model, "peft_config", {}) else None
        with use_adapter(model, adapter_name=adapter) if hasattr(model, "peft_config") else nullcontext():
            return self._completion_logps(self.model, batch, rows)

    # ------------------------------------------------------------------------------------------------------------
    # Loss: the F-TIS terms, fed to TRL's clipped surrogate (`trl_ftis.loss_hook`)
    # ------------------------------------------------------------------------------------------------------------
    def _compute_loss(self, model, inputs):
        """TRL's loss on a shallow copy of `inputs`, whose advantages and ratio reference the [`FTISLossHook`]
        rewrites. A training micro-batch that peer rows made larger than `peer_micro_batch_size` is computed in
        weighted row chunks, each but the last back-propagated here (the Trainer does the last): the same gradient, a
        micro-batch's memory."""
        rows, deepspeed = inputs["completion_ids"].shape[0], self.is_deepspeed_enabled
        size = chunk_size(self.args, rows, training=model.training, deepspeed=deepspeed)
        if size is None:
            return self._chunk_loss(model, inputs)
        with self._loss_hook.chunks():  # each chunk's F-TIS terms, logged once as the micro-batch's
            return chunked_loss(
                lambda c: self._chunk_loss(model, c), self.accelerator.backward, inputs, size, self.loss_type
            )

    def _chunk_loss(self, model, inputs):
        try:
            return super()._compute_loss(model, self._loss_hook.arm(inputs))
        finally:
            self._loss_hook.disarm()

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        """TRL's per-token log-probs and entropies; on the first call inside [`_compute_loss`], the F-TIS hook
        rewrites the armed batch from the `ℓθ` this call returns (`trl_ftis.loss_hook`: the contract with TRL)."""
        result = super()._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, logits_to_keep, *args, **kwargs
        )
        inputs = self._loss_hook.take_armed()
        if inputs is not None:
            self._loss_hook.apply(inputs, result[0])
        return result

    def train(self, resume_from_checkpoint: str | bool | None = None, *args, **kwargs):
        """[`~transformers.Trainer.train`]; when resuming, the F-TIS state saved with the checkpoint is restored
        first. `resume_from_checkpoint=True` takes the last *complete* checkpoint in `output_dir` (one that has its
        `trainer_state.json`: a process killed while saving leaves a newer, incomplete folder behind). On a command
        line, `--resume_from_checkpoint last` (or `latest`, `true`) does the same, and starts afresh when there is
        no checkpoint yet: a peer can be started and restarted with one command. When training ends, also when it
        raises, the peer announces that it leaves (`Swarm.leave`: the others stop waiting for it) and the swarm's
        transport and the async exchange worker are closed (a second call reopens the transport)."""
        if self.swarm is not None:
            self.swarm.reopen()  # does nothing unless a previous train() closed it
        try:
            checkpoint = resolve_resume(resume_from_checkpoint, self.args.output_dir)
            if checkpoint is not None and os.path.isdir(checkpoint):  # else the Trainer raises its own error
                self.load_ftis_state(checkpoint)
            return super().train(checkpoint, *args, **kwargs)
        finally:
            self._rounds.close()  # a background worker never outlives a train() call
            if self.swarm is not None:
                self.swarm.leave()  # the others stop waiting for this peer now, not after peer_timeout
                self.swarm.close()

    def training_step(self, model, inputs, num_items_in_batch):
        # `training` is the micro-batch's forward and backward: training_step without the making of a generation
        # batch inside it (generation, scoring and the exchange, timed by themselves).
        start, batches = self._clock.now(), self._batch_seconds
        loss = super().training_step(model, inputs, num_items_in_batch)
        self._clock.add("training", self._clock.now() - start - (self._batch_seconds - batches))
        # Counts per optimizer step (summed over its micro-batches), logged once the step is complete.
        if self._step % self.current_gradient_accumulation_steps == 0:
            counts = self._loss_hook.step_counts()
            filtered = counts.pop("rows_filtered", 0.0)
            self._metrics["train"]["ftis/peer_rows_filtered"].append(filtered)
            self._ledger.add("rows_filtered", filtered)
            for key, count in counts.items():
                self._metrics["train"][f"ftis/{key}"].append(count)
        return loss

    # ------------------------------------------------------------------------------------------------------------
    # Checkpoints: the owners' state, saved with each checkpoint and restored before resuming
    # ------------------------------------------------------------------------------------------------------------
    def _save_checkpoint(self, model, trial):
        # Written first: the Trainer's own files (trainer_state.json last) complete the checkpoint.
        folder = Path(self._get_output_dir(trial=trial)) / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        self._checkpoints.save(folder, self.state.global_step, self._loss_hook.adaptive_threshold)
        return super()._save_checkpoint(model, trial)

    def load_ftis_state(self, checkpoint: str | os.PathLike) -> bool:
        """Restore the F-TIS state saved in the checkpoint folder `checkpoint` (done by `train(resume_from_checkpoint=
        ...)`). Returns whether a state was found; `ValueError` naming the file when it is not valid (then nothing is
        restored). Queued rows are checked and admitted again (`trl_ftis.swarm.checkpoint` says what is checked)."""
        parsed = self._checkpoints.restore(checkpoint)
        if parsed is not None:
            self._loss_hook.adaptive_threshold = parsed.adaptive_threshold
        return parsed is not None

    # The only two Trainer methods that write training_args.bin (`torch.save(self.args)`; checkpoints, save_model,
    # push_to_hub): they run with `self.args` swapped for a copy without the secrets (FTISConfig.saving_redacted).
    _save = FTISConfig.saving_redacted(GRPOTrainer._save)
    _push_from_checkpoint = FTISConfig.saving_redacted(GRPOTrainer._push_from_checkpoint)

    def create_model_card(self, model_name=None, dataset_name=None, tags=None):
        """
        TRL's model card, plus what a reader needs to reproduce this run: the F-TIS variant and its hyper-parameters,
        the swarm (this peer and every peer it learned from, with their models) and the paper.

        Args:
            model_name (`str`, *optional*):
                Name of the model.
            dataset_name (`str`, *optional*):
                Name of the dataset used for training.
            tags (`str`, `list[str]`, *optional*):
                Tags to be associated with the model card.
        """
        super().create_model_card(model_name=model_name, dataset_name=dataset_name, tags=tags)
        if not self.is_world_process_zero():
            return
        add_ftis_section(
            Path(self.args.output_dir) / "README.md",
            self._model_name(),
            args=self.args,
            temperature=self.temperature,
            num_generations=self.num_generations,
            global_step=self.state.global_step,
            paper=self._paper,
            peers=self._ledger.peers(),
            accepted_by_peer=self._ledger.accepted_by_peer,
            peer_models=self.swarm.peer_models if self.swarm is not None else {},
            collaboration=self.collaboration(),
            results=card_results(self.state.log_history, dataset_name),
        )

    def summary(self) -> dict[str, Any]:
        """
        What this peer has done so far; also written to `output_dir/ftis_summary.json` when training ends.

        Returns:
            `dict[str, Any]`: `peer_id`, `steps`, `rows_sent`, `rows_received`, `rows_accepted`, `rows_filtered`,
            `bytes_sent`, `rows_retokenised` (rows of peers with another tokenizer, re-tokenised: `cross_tokenizer`),
            `reward` (the last logged), `exchange_worker_errors` (rounds an async exchange worker failed),
            `exchange_blocking_seconds` (the training loop's waits on the exchange, all steps together),
            `exchange_admission_seconds` (the free mode: admitting the rows the steps took, work that is not a wait),
            `train_seconds` (the Trainer's `train_runtime`), `peer_row_ages` (swarm rows trained on, by age in their
            sender's steps: `"0"`, `"1"`, ...), `refused`
            (counts by reason), `dropped` (received or added rows dropped, by reason: [`DROP_REASONS`]), `peers`
            (every peer whose rows were merged or whose messages were accepted), `peer_models` and `exchange_url`
            (password redacted); then the entries of [`collaboration`] (`time_seconds`, `generation_share`, ...),
            held-out results (`trl_ftis.evaluation`) and `curve`.
        """
        return peer_summary(
            args=self.args,
            state=self.state,
            ledger=self._ledger,
            rounds=self._rounds,
            swarm=self.swarm,
            collaboration=self.collaboration(),
            callbacks=self.callback_handler.callbacks,
        )

    def collaboration(self) -> dict[str, Any]:
        """What collaboration bought so far (`trl_ftis.collaboration_report.collaboration_report`): `time_seconds`
        (this process's optimizer steps split into `generation`, `scoring`, `exchange`, `training`, `other`),
        `generation_share` (f), `own_generation`, `peer_value` (in total and per peer: rows accepted, rows in the loss,
        tokens, effective sample size fraction, filtered fraction, own rows they are worth, own generation seconds
        they stood in for) and `collaboration`, the same as one sentence."""
        return collaboration_report(self._clock, self._value, self._ledger.accepted_by_peer, self._ledger.peers())
