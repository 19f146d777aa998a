"""Peer-row admission: every received row is either trained on correctly or dropped and counted by reason, and its
rewards can be recomputed with the receiver's own reward functions.

[`Admission`] is an object with explicit dependencies (the config, the tokenizer, a prompt renderer, the vocabulary
and context limits, a [`RewardScorer`] and the [`PeerRowLedger`] it counts drops in), composed by `FTISTrainer` and
shared by `add_peer_rows`, the swarm round (`trl_ftis.swarm.rounds`) and the merge; it can be built and tested without
a trainer. It never rewrites a received [`PeerRow`]: what it keeps comes out as a frozen [`AdmittedRow`], in this
trainer's tokens, with safe columns and its prompt rendered once (`prompt_ids`, used again by the merge).
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from ..peer_rows import (
    MAX_ABS_ADVANTAGE,
    AdmittedRow,
    PeerRow,
    ScoredRow,
    prompt_columns,
    prompt_key,
    row_problem,
    row_problems,
)
from .scoring import RESERVED_REWARD_COLUMNS, RewardScorer

if TYPE_CHECKING:
    from ..config import FTISConfig
    from .ledger import PeerRowLedger

logger = logging.getLogger(__name__)

__all__ = [
    "CHAT_ROLES",
    "DROP_REASONS",
    "STRIP_REASONS",
    "Admission",
    "PromptRenderer",
    "control_token_ids",
    "statistics_problem",
]

CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
"""Roles a received chat message may have. Another role is rendered by most chat templates as something it is not
(or refused), so the row is dropped (`bad_chat_prompt`)."""

DROP_REASONS: dict[str, str] = {
    "bad_ids": "completion token ids that are not integers in [0, vocab_limit)",
    "bad_logps": "generator log-probs that are not finite and <= 0",
    "too_long": "a completion longer than max_completion_length, or a prompt and completion longer than the model's "
    "context (max_position_embeddings)",
    "bad_prompt": "a prompt that is neither a string nor a list of chat messages, or that the tokenizer cannot encode",
    "empty_prompt": "an empty prompt ('' or []), or one that renders to no tokens",
    "bad_chat_prompt": "chat messages without a string role and content, with a role outside "
    f"{sorted(CHAT_ROLES)}, or that this trainer's chat template cannot render",
    "no_chat_template": "a chat prompt, but this trainer's tokenizer has no chat template",
    "bad_columns": "extra columns that are not a dict with string keys",
    "unknown_prompt": "a prompt that is not in this trainer's training set (require_known_prompts)",
    "reward_error": "a reward function raised, or returned the wrong number of rewards, for the rows' group (same "
    "sender, prompt kind and columns)",
    "unscorable": "every reward function returned None",
    "nonfinite": "a reward, advantage or group statistic that is not finite",
    "advantage_too_large": f"an advantage above {MAX_ABS_ADVANTAGE:g} in magnitude (scale_rewards='none' with "
    "enormous rewards)",
    "batch_split": "trimmed so that the peer rows split evenly over the micro-batches and processes",
    "internal_error": "an unexpected error while processing the round's rows (logged with its traceback)",
    "foreign_tokenizer": "completion ids in another tokenizer's tokens, but cross_tokenizer is off",
    "no_text": "a completion from a peer with another tokenizer without a usable text (none sent, or empty), or that "
    "ended with an end-of-sequence token when this tokenizer has none",
    "text_round_trip": "a completion text that does not survive re-tokenisation with this trainer's tokenizer "
    "(decode(encode(text)) != text: characters it cannot represent)",
    "text_special_tokens": "a completion text that this trainer's tokenizer reads as special or added tokens (a "
    "chat-template marker, padding, end of sequence...) inside the completion",
    "text_budget": "a completion text beyond this round's text budget (cross_tokenizer): texts this receiver can use "
    "in one round, derived from its own settings, were tokenised first",
    "special_tokens": "completion ids holding a special or added token of this trainer's tokenizer (a chat-template "
    "marker, padding, an added token...) anywhere but as the final end of sequence: reward functions would see the "
    "text without it while the loss trains on it",
    "truncated": "a completion without an end of sequence (cut at its sender's max_completion_length) while this "
    "trainer has mask_truncated_completions on: TRL leaves such completions out of the loss, as for its own",
    "queue_full": "more rows than a queue holds (4 x the peer-row cap): add_peer_rows drops the rows beyond it, a "
    "queue of arrived rows (the free mode's) the oldest",
}
"""Why a received row is dropped: each is counted in `ftis/peer_rows_dropped/<reason>` (and the total in
`ftis/peer_rows_dropped`) and warned about once per peer and reason. An exchange mode adds the reasons only it
counts (its `drop_reasons`, which the ledger learns when the mode is built)."""

STRIP_REASONS: dict[str, str] = {
    "reserved_column": "extra columns named like an argument TRL passes to reward functions "
    f"({', '.join(sorted(RESERVED_REWARD_COLUMNS))}) were removed; the rows are kept",
}
"""Why a received row was changed (and kept): counted in `ftis/peer_rows_stripped/<reason>`."""

PromptRenderer = Callable[[list[Any]], Sequence[Sequence[int]]]
"""Renders and tokenizes prompts of one kind (all plain or all chat) as the trainer renders its own
(`GRPOTrainer._tokenize_prompts`: its chat template with `add_generation_prompt`), one id list per prompt; raises when
it cannot."""


class _Candidate(NamedTuple):
    """A received row on its way through the admission: the values that replace the row's own (never written back)."""

    row: PeerRow
    completion_ids: Any
    generator_logps: Any
    extra: Any
    text_level: bool

    @property
    def sender(self) -> Any:
        return self.row.sender

    @property
    def prompt(self) -> Any:
        return self.row.prompt


class Admission:
    """
    Admission, rescoring and the last statistics check of peer rows.

    Args:
        config ([`FTISConfig`]): reads `cross_tokenizer`, `text_level_peer_rows`, `require_known_prompts` and
            `max_completion_length`.
        tokenizer: this trainer's tokenizer (re-tokenisation of other tokenizers' texts).
        render ([`PromptRenderer`]): renders prompts as the trainer renders its own.
        ledger ([`PeerRowLedger`]): where dropped and changed rows are counted.
        vocab_limit (`int`): token ids must be below it.
        context_length (`int`, *optional*): the model's context; a prompt and completion longer are dropped.
        has_chat_template (`bool`): whether chat prompts can be rendered at all.
        eos_token_id (`int`, *optional*): appended to a re-tokenised completion that ended with the sender's own.
        stop_token_ids (`Sequence[int]`, *optional*): the ids a completion may end with (the model's end-of-sequence
            ids; `eos_token_id` is always one); every other special or added token is refused in a completion.
        scorer ([`RewardScorer`], *optional*): for [`rescore`].
        dataset (*optional*): the training set, whose columns a known prompt gets (`admit(..., local_columns=True)`).
    """

    def __init__(
        self,
        *,
        config: FTISConfig,
        tokenizer,
        render: PromptRenderer,
        ledger: PeerRowLedger,
        vocab_limit: int,
        context_length: int | None = None,
        has_chat_template: bool = False,
        eos_token_id: int | None = None,
        scorer: RewardScorer | None = None,
        dataset=None,
        stop_token_ids: Sequence[int] = (),
    ):
        self.config = config
        self.tokenizer = tokenizer
        self.render = render
        self.ledger = ledger
        self.vocab_limit = int(vocab_limit)
        self.context_length = context_length
        self.has_chat_template = bool(has_chat_template)
        self.eos_token_id = eos_token_id
        self.control_ids = control_token_ids(tokenizer)
        # What this receiver can use, in characters, so that oversize prompts and texts are dropped from their length
        # alone, before any tokenisation: a prompt must fit the context, a text max_completion_length of our tokens,
        # and no token of ours stands for more characters than the longest one in the vocabulary.
        token_chars = longest_token_chars(tokenizer)
        self.max_prompt_chars = (context_length or DEFAULT_CONTEXT_TOKENS) * token_chars
        self.max_text_chars = int(config.max_completion_length) * token_chars
        rows_per_round = max(int(config.max_peer_rows or 0), int(config.generation_batch_size or 0), 1)
        self.max_round_text_chars = TEXT_ROUNDS_OF_ROWS * rows_per_round * self.max_text_chars
        self.stop_ids = np.asarray(
            sorted({int(i) for i in stop_token_ids} | ({int(eos_token_id)} if eos_token_id is not None else set())),
            dtype=np.int64,
        )
        self.scorer = scorer
        self.dataset = dataset
        self._prompt_columns: dict[str, dict[str, Any]] | None = None  # prompt key -> training set columns

    # -- admission --------------------------------------------------------------------------------------------------
    def admit(self, rows: Sequence[PeerRow], *, local_columns: bool = False) -> list[AdmittedRow]:
        """
        The admission of received rows, shared by the swarm round and `add_peer_rows`: everything that can be decided
        from a row alone. Never raises because of a row's content: a row is kept (as an [`AdmittedRow`]), or dropped
        and counted by reason ([`DROP_REASONS`]).

        First, rows of a peer with another tokenizer are re-tokenised ([`_in_own_tokens`]). Then, in order: ids and
        log-probs (`bad_ids`, `bad_logps`: the wire format and `add_peer_rows` already refuse them), the completion
        length (`too_long`), the prompt's shape (`bad_prompt`, `empty_prompt`, `bad_chat_prompt`,
        `no_chat_template`) and the columns' (`bad_columns`); then columns named like a reward function argument are
        removed ([`RESERVED_REWARD_COLUMNS`], `reserved_column`) and, with `local_columns`, a known prompt gets the
        training set's own columns instead (`unknown_prompt` under `require_known_prompts`); last, each distinct
        prompt is rendered as this trainer renders its own (plain and chat prompts separately: the kind of a batch is
        its first prompt's for TRL), and a prompt that fails (`bad_chat_prompt`, `bad_prompt`), renders to no tokens
        (`empty_prompt`) or does not fit the model's context with its completion (`too_long`) is dropped.

        What is left later: rescoring (`reward_error`, `unscorable`, `nonfinite`) and the group statistics
        (`nonfinite`, `advantage_too_large`) in the round, and `batch_split` at the merge.
        """
        rows = list(rows)
        if not rows:
            return []
        candidates = self._in_own_tokens(rows)
        problems = row_problems(candidates, self.vocab_limit)
        problems = [problem or self._shape_problem(c) for c, problem in zip(candidates, problems, strict=True)]
        candidates = self.ledger.sift(candidates, problems)
        candidates = self._strip_reserved_columns(candidates)
        if local_columns:
            candidates = self._with_local_columns(candidates)
        return self._rendered(candidates)

    def restore(self, rows: Sequence[PeerRow]) -> list[AdmittedRow]:
        """Rows admitted before and saved in a checkpoint (without their prompt ids), admitted again. A checkpoint's
        files are as untrusted as a peer's message: ids, log-probs, lengths, prompts and columns are checked as
        [`admit`] checks them (dropped and counted by the same reasons) and the prompts rendered; they are not
        re-tokenised, and a re-tokenised row keeps its `text_level`."""
        rows = list(rows)
        candidates = [
            _Candidate(
                row,
                row.completion_ids,
                row.generator_logps,
                {} if row.extra is None else row.extra,
                bool(row.text_level),
            )
            for row in rows
        ]
        problems = row_problems(candidates, self.vocab_limit)
        problems = [problem or self._shape_problem(c) for c, problem in zip(candidates, problems, strict=True)]
        candidates = self._strip_reserved_columns(self.ledger.sift(candidates, problems))
        return self._rendered(candidates)

    def _in_own_tokens(self, rows: list[PeerRow]) -> list[_Candidate]:
        """
        Every row in this trainer's tokens. Rows in another tokenizer's tokens (`foreign_tokenizer`, and every row
        with a text under `text_level_peer_rows`) are re-tokenised: their text is tokenised with this tokenizer (no
        special tokens added; its end-of-sequence token appended when the sender's completion ended with its own),
        and every generator log-prob becomes the sender's total over its tokens divided by the new length, so that
        the sum is still the sender's `Σ ℓgen` of the text. Such rows are marked `text_level`: the objective gives
        them one sequence-level weight `min(exp(Σ ℓθ - Σ ℓgen), C)`.

        Dropped and counted: rows that came in another tokenizer while `cross_tokenizer` is off
        (`foreign_tokenizer`), without a text (`no_text`), with generator log-probs that are not finite and <= 0
        (`bad_logps`), whose text does not survive `decode(encode(text))` (`text_round_trip`: characters this
        tokenizer maps to an unknown token, normalisation) or holds this tokenizer's special tokens
        (`text_special_tokens`: a peer must not smuggle a chat-template marker into the completion).
        """
        measuring = self.config.text_level_peer_rows  # measuring the approximation: every text is foreign
        foreign = [row.foreign_tokenizer or (measuring and row.completion_text is not None) for row in rows]
        candidates = [
            _Candidate(row, row.completion_ids, row.generator_logps, {} if row.extra is None else row.extra, False)
            for row in rows
        ]
        if not any(foreign):
            return candidates
        if not self.config.cross_tokenizer:  # nothing to tokenise: every such row is dropped
            return self.ledger.sift(candidates, ["foreign_tokenizer" if f else None for f in foreign])
        tokenizer = self.tokenizer
        others = [row for row, f in zip(rows, foreign, strict=True) if f]
        early = self._text_budget(others)  # decided from lengths alone: nothing over it is tokenised
        if early:
            candidates = self.ledger.sift(candidates, [early.get(id(c.row)) for c in candidates])
            others = [row for row in others if id(row) not in early]
        texts = [row.completion_text if isinstance(row.completion_text, str) else "" for row in others]
        encoded = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
        # One row at a time: some transformers versions read a batch that starts with an empty row as one sequence.
        decoded = [
            tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False) for ids in encoded
        ]
        special = set(self.control_ids.tolist())
        eos = self.eos_token_id
        problems: dict[int, str] = {}
        tokens: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for row, ids, text in zip(others, encoded, decoded, strict=True):
            problem = None
            if (
                not isinstance(row.completion_text, str)
                or not (ids or row.ends_with_eos)
                or (row.ends_with_eos and eos is None)
            ):
                problem = "no_text"
            elif (shape := row_problem(row, vocab_limit=2**63)) is not None:  # the sender's ids: any ints >= 0
                problem = shape
            elif text != row.completion_text:
                problem = "text_round_trip"
            elif special.intersection(ids):
                problem = "text_special_tokens"
            if problem is not None:
                problems[id(row)] = problem
                continue
            ids = list(ids) + ([int(eos)] if row.ends_with_eos else [])
            total = float(np.sum(np.asarray(row.generator_logps, dtype=np.float64)))
            tokens[id(row)] = (np.asarray(ids, dtype=np.int64), np.full(len(ids), total / len(ids), dtype=np.float64))
        self.ledger.add("rows_retokenised", len(others) - len(problems))
        candidates = [
            c._replace(completion_ids=tokens[id(c.row)][0], generator_logps=tokens[id(c.row)][1], text_level=True)
            if id(c.row) in tokens
            else c
            for c in candidates
        ]
        return self.ledger.sift(candidates, [problems.get(id(c.row)) for c in candidates])

    def _text_budget(self, rows: list[PeerRow]) -> dict[int, str]:
        """`id(row) -> reason` for the texts not to tokenise: longer than `max_text_chars` (`too_long`), or beyond
        this round's `max_round_text_chars`, in the order received (`text_budget`)."""
        problems, spent = {}, 0
        for row in rows:
            size = len(row.completion_text) if isinstance(row.completion_text, str) else 0
            if size > self.max_text_chars:
                problems[id(row)] = "too_long"
            elif spent + size > self.max_round_text_chars:
                problems[id(row)] = "text_budget"
            else:
                spent += size
        return problems

    def _shape_problem(self, candidate: _Candidate) -> str | None:
        if len(candidate.completion_ids) > self.config.max_completion_length:
            return "too_long"
        if prompt_chars(candidate.prompt) > self.max_prompt_chars:  # before it is rendered or tokenised
            return "too_long"
        if self.holds_control_tokens(candidate.completion_ids):
            return "special_tokens"
        problem = self.prompt_problem(candidate.prompt)
        if problem is not None:
            return problem
        extra = candidate.extra
        if not isinstance(extra, dict) or not all(isinstance(key, str) for key in extra):
            return "bad_columns"
        return None

    def holds_control_tokens(self, completion_ids: Any) -> bool:
        """Whether `completion_ids` (checked integers) hold a special or added token anywhere but as a final stop
        id."""
        ids = np.asarray(completion_ids, dtype=np.int64).reshape(-1)
        if not ids.size or not self.control_ids.size:
            return False
        if np.isin(ids[:-1], self.control_ids).any():
            return True
        return bool(np.isin(ids[-1:], self.control_ids).any() and not np.isin(ids[-1:], self.stop_ids).any())

    def prompt_problem(self, prompt: Any) -> str | None:
        """Why `prompt` cannot be rendered, from its shape alone, or `None`."""
        if isinstance(prompt, str):
            return None if prompt else "empty_prompt"
        if not isinstance(prompt, list):
            return "bad_prompt"
        if not prompt:
            return "empty_prompt"
        for message in prompt:
            if not (
                isinstance(message, dict)
                and isinstance(message.get("role"), str)
                and isinstance(message.get("content"), str)
                and message["role"] in CHAT_ROLES
                # Other keys (`name`, ...) as the wire format allows them: strings or null.
                and all(isinstance(key, str) and (v is None or isinstance(v, str)) for key, v in message.items())
            ):
                return "bad_chat_prompt"
        if not self.has_chat_template:
            return "no_chat_template"
        return None

    def _strip_reserved_columns(self, candidates: list[_Candidate]) -> list[_Candidate]:
        counts: Counter = Counter()
        names: dict[str, set[str]] = {}
        out = []
        for c in candidates:
            reserved = RESERVED_REWARD_COLUMNS.intersection(c.extra)
            if reserved:
                c = c._replace(extra={key: v for key, v in c.extra.items() if key not in RESERVED_REWARD_COLUMNS})
                counts[str(c.sender)] += 1
                names.setdefault(str(c.sender), set()).update(reserved)
            out.append(c)
        for sender, count in counts.items():
            self.ledger.count(
                sender, "reserved_column", count, stripped=True, detail="removed " + ", ".join(sorted(names[sender]))
            )
        return out

    def _with_local_columns(self, candidates: list[_Candidate]) -> list[_Candidate]:
        """Give rows whose prompt is in our training set our own columns (the gold answer a reward function reads):
        a peer must not be able to send a wrong gold answer along with a completion that matches it. Under
        `require_known_prompts` the other rows are dropped (`unknown_prompt`, also in `summary()["refused"]`)."""
        if self._prompt_columns is None:
            self._prompt_columns = prompt_columns(self.dataset)
        problems, out = [], []
        for c in candidates:
            local = self._prompt_columns.get(prompt_key(c.prompt))
            if local is not None:  # without the columns TRL itself never passes to reward functions (`completion`)
                c = c._replace(extra={key: v for key, v in local.items() if key not in RESERVED_REWARD_COLUMNS})
            out.append(c)
            problems.append("unknown_prompt" if local is None and self.config.require_known_prompts else None)
        unknown = problems.count("unknown_prompt")
        if unknown:
            self.ledger.refuse("unknown_prompt", unknown)
        return self.ledger.sift(out, problems)

    def _rendered(self, candidates: list[_Candidate]) -> list[AdmittedRow]:
        """The candidates whose prompt renders and fits the context with the completion, as [`AdmittedRow`]s."""
        rendered = self.render_prompts([c.prompt for c in candidates])
        context = self.context_length
        problems = []
        for c, ids in zip(candidates, rendered, strict=True):
            if isinstance(ids, str):
                problems.append(ids)
            elif context is not None and len(ids) + len(c.completion_ids) > context:
                problems.append("too_long")
            else:
                problems.append(None)
        prompt_ids = [ids for ids, problem in zip(rendered, problems, strict=True) if problem is None]
        return [
            AdmittedRow(
                prompt=c.row.prompt,
                prompt_ids=ids,
                completion_ids=c.completion_ids,
                generator_logps=c.generator_logps,
                reward=c.row.reward,
                group=c.row.group,
                sender=c.row.sender,
                rewards_per_func=c.row.rewards_per_func,
                extra=c.extra,
                round=c.row.round,
                text_level=c.text_level,
            )
            for c, ids in zip(self.ledger.sift(candidates, problems), prompt_ids, strict=True)
        ]

    # -- prompts ----------------------------------------------------------------------------------------------------
    def render_prompts(self, prompts: Sequence[Any]) -> list[tuple[int, ...] | str]:
        """
        Each prompt rendered as this trainer renders its own (the [`PromptRenderer`]) and tokenized, or the reason it
        cannot be (`bad_chat_prompt`, `bad_prompt`, `empty_prompt` for no tokens).

        Plain and chat prompts go to separate calls (TRL decides a batch's kind from its first prompt), each distinct
        prompt once (rows of one prompt share the same ids); a call that fails is split in halves until the prompts
        that fail are found, so one bad prompt costs a few calls, not one per prompt.
        """
        keys = [prompt_key(prompt) for prompt in prompts]
        distinct: dict[str, Any] = {}
        for key, prompt in zip(keys, prompts, strict=True):
            distinct.setdefault(key, prompt)
        rendered: dict[str, tuple[int, ...] | str] = {}
        for chat in (False, True):
            self._render_batch([(k, p) for k, p in distinct.items() if isinstance(p, list) == chat], chat, rendered)
        return [rendered[key] for key in keys]

    def _render_batch(self, batch: list[tuple[str, Any]], chat: bool, out: dict[str, tuple[int, ...] | str]) -> None:
        if not batch:
            return
        try:
            ids = [tuple(int(token) for token in one) for one in self.render([prompt for _, prompt in batch])]
            if len(ids) != len(batch):
                raise ValueError(f"{len(ids)} tokenized prompts for {len(batch)}")
        except Exception:  # noqa: BLE001 - any failure of the template or tokenizer on a peer's prompt drops it
            if len(batch) == 1:
                out[batch[0][0]] = "bad_chat_prompt" if chat else "bad_prompt"
                return
            half = len(batch) // 2
            self._render_batch(batch[:half], chat, out)
            self._render_batch(batch[half:], chat, out)
            return
        for (key, _), one in zip(batch, ids, strict=True):
            out[key] = one if one else "empty_prompt"

    # -- scores and statistics ----------------------------------------------------------------------------------------
    def rescore(self, rows: Sequence[AdmittedRow]) -> list[AdmittedRow]:
        """The rows with rewards recomputed by this trainer's reward functions ([`RewardScorer`]); the rows a reward
        function raised for (`reward_error`), that every function declined (`unscorable`) or whose total is not
        finite (`nonfinite`) are dropped and counted."""
        if not rows:
            return list(rows)
        scores, problems, errors = self.scorer.score(rows)
        rescored = [
            row.rescored(total, per_func) if problem is None else row
            for row, (total, per_func), problem in zip(rows, scores, problems, strict=True)
        ]
        return self.ledger.sift(rescored, problems, errors)

    def guard_statistics(self, rows: Sequence[ScoredRow]) -> list[ScoredRow]:
        """The last check before rows become tensors: a finite reward, a finite advantage of at most
        [`MAX_ABS_ADVANTAGE`] in magnitude (`nonfinite`, `advantage_too_large`), so that no peer value can make the
        loss or a gradient non-finite."""
        return self.ledger.sift(rows, [statistics_problem(row) for row in rows])


def statistics_problem(row: Any) -> str | None:
    """Why `row`'s reward or group statistics cannot enter the loss (`nonfinite`, `advantage_too_large`), or `None`."""
    try:
        reward, advantage = float(row.reward), float(row.advantage)
        int(row.group_max_length)
    except (TypeError, ValueError, OverflowError):
        return "nonfinite"
    if not (math.isfinite(reward) and math.isfinite(advantage)):
        return "nonfinite"
    return "advantage_too_large" if abs(advantage) > MAX_ABS_ADVANTAGE else None


def control_token_ids(tokenizer) -> np.ndarray:
    """The ids a peer's completion must not hold inside it, sorted: the tokenizer's special tokens
    (`all_special_ids`) and every added token (`added_tokens_decoder`: added tokens such as `<file_sep>` are left out
    of `all_special_ids` by some tokenizers, SmolLM2's among them). Decoding for the reward functions may drop them
    while the loss trains on them, and a chat-template marker mid-completion is a prompt injection."""
    ids = set(getattr(tokenizer, "all_special_ids", None) or [])
    ids |= set((getattr(tokenizer, "added_tokens_decoder", None) or {}).keys())
    return np.asarray(sorted(int(i) for i in ids if isinstance(i, int) and i >= 0), dtype=np.int64)


DEFAULT_CONTEXT_TOKENS = 32_768
"""The context assumed for a model that declares none (`max_position_embeddings`), to bound peers' prompts."""
TEXT_ROUNDS_OF_ROWS = 4
"""A round tokenises the texts of at most this many times the rows a step trains on (`max_peer_rows`, or as many
as its own `generation_batch_size`), each at most `max_completion_length` of its tokens long."""


def longest_token_chars(tokenizer) -> int:
    """The most characters one token of `tokenizer` stands for: its longest vocabulary entry (byte-level and
    SentencePiece entries are at least as long as the text they decode to), at least 1."""
    try:
        vocab = tokenizer.get_vocab()
    except (AttributeError, NotImplementedError, TypeError):
        return 64  # a tokenizer without a vocabulary to read: a generous bound
    return max((len(token) for token in vocab if isinstance(token, str)), default=1) or 1


def prompt_chars(prompt: Any) -> int:
    """A prompt's size in characters: the string, or every string of its chat messages (0 for other shapes)."""
    if isinstance(prompt, str):
        return len(prompt)
    if isinstance(prompt, list):
        return sum(
            sum(len(v) for v in message.values() if isinstance(v, str)) if isinstance(message, dict) else 0
            for message in prompt
        )
    return 0
