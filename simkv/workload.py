"""What a stateful session does: the operations of the stateful inference API.

A workload is a sequence of operations on one request's KV state. Every
operation is one *step* of the simulation (step 0 is the first prefill):

* ``Prefill(n)`` — one inference appending ``n`` tokens (the prompt, or a new
  chat turn appended to the stored history);
* ``Decode(n)`` — ``n`` inferences appending one token per beam each;
* ``Fork(w)`` — one decode inference whose ``beam_idx`` widens the batch to
  ``w`` beams, all copies of beam 0 (``beam_idx = [0] * w``);
* ``Reorder()`` — one decode inference that permutes beams at the same width;
* ``Select(i)`` — one decode inference that keeps beam ``i`` only (width 1);
* ``Reset()`` — ``reset_state()``: the stored history is dropped;
* ``Trim(n)`` — the last ``n`` stored tokens are cut off (no inference): what GenAI's
  stateful chat does when the re-tokenized history differs from what the cache holds
  (``align_cache_and_history`` then ``utils::trim_kv_cache``: ``set_state`` with a shorter
  tensor); each runtime's own effect on memory is its policy's (``Policy.trim_rule``).

Workloads also have a compact text form for the command line, e.g.
``prefill:1024,decode:256,fork:4,decode:100,select:0,prefill:64,decode:32,trim:20,prefill:36,reset``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Union

from simkv.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Prefill:
    tokens: int


@dataclass(frozen=True, slots=True)
class Decode:
    steps: int


@dataclass(frozen=True, slots=True)
class Fork:
    width: int


@dataclass(frozen=True, slots=True)
class Reorder:
    pass


@dataclass(frozen=True, slots=True)
class Select:
    beam: int = 0


@dataclass(frozen=True, slots=True)
class Reset:
    pass


@dataclass(frozen=True, slots=True)
class Trim:
    tokens: int


Op = Union[Prefill, Decode, Fork, Reorder, Select, Reset, Trim]


@dataclass(frozen=True, slots=True)
class Inference:
    """One step as the engines see it: tokens appended and the batch before and after."""

    phase: str  # prefill | turn | decode | fork | reorder | select | reset | trim
    tokens: int  # appended per beam (0 for reset; a trim removes: minus the tokens cut off)
    batch_in: int  # beams stored before this step
    batch: int  # beams after this step's beam_idx gather


def _positive(value: int, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"{what} must be a positive integer, got {value!r}")
    return value


def _not_negative(value: int, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"{what} must be a non-negative integer, got {value!r}")
    return value


@dataclass(frozen=True)
class Workload:
    ops: tuple[Op, ...]

    def __post_init__(self) -> None:
        if not self.ops:
            raise ConfigError("workload is empty")
        batch, stored = 1, 0
        for op in self.ops:
            match op:
                case Prefill(tokens=n):
                    _positive(n, "prefill tokens")
                case Decode(steps=n):
                    _positive(n, "decode steps")
                case Fork(width=w):
                    if _positive(w, "fork width") < 2:
                        raise ConfigError("fork width must be at least 2 beams")
                case Select(beam=i):
                    if not 0 <= i < batch:
                        raise ConfigError(f"select: beam {i} does not exist (width {batch})")
                case Reset() | Reorder():
                    pass
                case Trim(tokens=n):
                    if stored and _positive(n, "trim tokens") >= stored:
                        raise ConfigError(f"trim:{n} must keep at least one of the {stored} tokens stored "
                                          "(a new history is a reset)")
                    if batch > 1:
                        raise ConfigError(f"trim:{n} needs one sequence; select a beam first (width {batch})")
                case _:
                    raise ConfigError(f"not a workload operation: {op!r}")
            if not isinstance(op, (Prefill, Reset)) and stored == 0:
                raise ConfigError(f"{describe_op(op)} needs a prompt first (prefill)")
            if isinstance(op, Decode):
                stored += op.steps
            else:
                inf = inference_of(op, batch, stored)
                batch, stored = inf.batch, 0 if inf.phase == "reset" else stored + inf.tokens

    def inferences(self) -> Iterator[Inference]:
        """Expand the operations into steps (a ``Decode(n)`` is n steps)."""
        batch, stored = 1, 0
        for op in self.ops:
            if isinstance(op, Decode):
                for _ in range(op.steps):
                    yield Inference("decode", 1, batch, batch)
                stored += op.steps
                continue
            inf = inference_of(op, batch, stored)
            yield inf
            batch = inf.batch
            stored = 0 if isinstance(op, Reset) else stored + inf.tokens

    @property
    def steps(self) -> int:
        return sum(op.steps if isinstance(op, Decode) else 1 for op in self.ops)

    @property
    def max_tokens(self) -> int:
        """Longest history the session ever stores."""
        longest = stored = 0
        for inf in self.inferences():
            stored = 0 if inf.phase == "reset" else stored + inf.tokens
            longest = max(longest, stored)
        return longest

    @property
    def max_prompt(self) -> int:
        """Largest single multi-token inference (a prompt or a chat turn)."""
        return max((op.tokens for op in self.ops if isinstance(op, Prefill)), default=0)

    def __str__(self) -> str:
        return ",".join(describe_op(op) for op in self.ops)


def inference_of(op: Op, batch: int, stored: int) -> Inference:
    """The one step a non-decode operation performs on a state of ``batch`` beams × ``stored`` tokens."""
    match op:
        case Prefill(tokens=n):
            return Inference("turn" if stored else "prefill", n, batch, batch)
        case Fork(width=w):
            return Inference("fork", 1, batch, w)
        case Reorder():
            return Inference("reorder", 1, batch, batch)
        case Select():
            return Inference("select", 1, batch, 1)
        case Reset():
            return Inference("reset", 0, batch, 1)
        case Trim(tokens=n):
            return Inference("trim", -n, batch, batch)
    raise ConfigError(f"not a single-step operation: {op!r}")


def describe_op(op: Op) -> str:
    match op:
        case Prefill(tokens=n):
            return f"prefill:{n}"
        case Decode(steps=n):
            return f"decode:{n}"
        case Fork(width=w):
            return f"fork:{w}"
        case Select(beam=i):
            return f"select:{i}"
        case Reorder():
            return "reorder"
        case Reset():
            return "reset"
        case Trim(tokens=n):
            return f"trim:{n}"
    raise ConfigError(f"not a workload operation: {op!r}")


_PARSERS = {
    "prefill": (Prefill, True), "turn": (Prefill, True), "decode": (Decode, True),
    "fork": (Fork, True), "select": (Select, False), "reorder": (Reorder, None), "reset": (Reset, None),
    "trim": (Trim, True),
}


def parse_ops(text: str) -> Workload:
    """Parse ``prefill:1024,decode:2048,reset,...`` into a workload."""
    ops: list[Op] = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, arg = item.partition(":")
        if name not in _PARSERS:
            raise ConfigError(f"unknown operation {name!r} in --ops; use {', '.join(_PARSERS)}")
        cls, needs_arg = _PARSERS[name]
        if needs_arg is None:
            if arg:
                raise ConfigError(f"operation {name!r} takes no argument")
            ops.append(cls())
            continue
        if not arg:
            if needs_arg:
                raise ConfigError(f"operation {name!r} needs a number, e.g. {name}:16")
            ops.append(cls())
            continue
        try:
            value = int(arg)
        except ValueError:
            raise ConfigError(f"operation {item!r}: {arg!r} is not an integer") from None
        ops.append(cls(value))
    return Workload(tuple(ops))


def chat_session(
    prompt: int,
    decode: int,
    *,
    turns: int = 0,
    turn_tokens: int = 64,
    turn_decode: int | None = None,
    beam: int = 1,
    turn_divergence: int = 0,
) -> Workload:
    """The common shape: a prompt, ``decode`` generated tokens, then ``turns`` more chat turns.

    With ``beam > 1`` every answer is generated with that many beams (fork on
    the first generated token, select beam 0 on the last). With ``turn_divergence`` D,
    the history GenAI re-tokenizes each turn differs from what the cache holds in its last
    D tokens (an answer's tail, a template's end-of-turn marks): each turn first cuts them off
    (``trim:D``) and prefills them again with its own tokens (``prefill:turn_tokens + D``),
    as ``align_cache_and_history`` + ``trim_kv_cache`` do (openvino.genai ``lm_encoding.cpp``,
    ``utils.cpp``).
    """
    _positive(prompt, "prompt")
    _not_negative(decode, "decode")  # 0: a prompt-only run
    _positive(beam, "beam width")
    if turns < 0:
        raise ConfigError(f"turns must be >= 0, got {turns}")
    _not_negative(turn_divergence, "turn divergence")
    turn_decode = decode if turn_decode is None else turn_decode

    def answer(n: int) -> list[Op]:
        if n == 0 and beam == 1:
            return []
        if beam == 1:
            return [Decode(n)]
        if n < 3:
            raise ConfigError("beam search needs at least 3 decode steps (fork, decode, select)")
        return [Fork(beam), Decode(n - 2), Select(0)]

    ops: list[Op] = [Prefill(prompt), *answer(decode)]
    for _ in range(turns):
        _positive(turn_tokens, "turn tokens")
        retokenized = [Trim(turn_divergence)] if turn_divergence else []
        ops += [*retokenized, Prefill(turn_tokens + turn_divergence), *answer(_not_negative(turn_decode, "turn decode"))]
    return Workload(tuple(ops))
