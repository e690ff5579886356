"""What a compiled decode does on every iteration of its loops, read from XLA's optimized HLO.

A TPU decode is fast only if each iteration of its `lax.while_loop`s streams the weights once and
does nothing else that scales with the model. A CPU profile cannot show what XLA:TPU made of the
program; its optimized HLO (`compiled.as_text()`) can. `analyze(text)` finds every `while`, the
computations its body and condition reach (fusions, conditional branches, nested loops) and, in
them, four things that must not be there:

  - **host transfer**: send / recv / infeed / outfeed, or a custom call to a host callback: a round
    trip to the host per iteration;
  - **weight copy**: a `copy` or `transpose` of a weight, i.e. of a value that comes, through
    forwarding ops only (tuples, get-tuple-element, bitcasts, asynchronous copies into another
    memory space, the loop's invariant state, fusion and branch parameters), from a program
    argument under `params`: a weight re-laid-out on every iteration that runs it;
  - **cache copy**: a `copy` or `transpose` whose result has the shape of an array of rank >= 3
    that the loop carries and changes (an attention cache [B, L, H, D]): the cache rewritten whole
    instead of updated in place;
  - **cross-attention K/V in the loop**: any computing use of a cross-attention key or value
    kernel (`encoder_decoder_attention/key|value`): keys and values recomputed per step instead
    of once in the prefill.

Weights are recognised by the argument names jax writes into the entry parameters' metadata
(`op_name="params['target']['decoder']..."`), so the program must take its parameters as an
argument named `params` (as `Partitioner.partition_predict` does). Each finding names the
instruction, its shape with layout and the weight or loop state it reads.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Iterable

_COMPUTATION = re.compile(r"^(ENTRY )?%?([\w.\-]+) \(.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(ROOT )?%([\w.\-]+) = (.*)$")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_ARRAY = re.compile(r"(\w+)\[([\d,]*)\]")
_OPERAND = re.compile(r"%([\w.\-]+)")
_INDEX = re.compile(r"\bindex=(\d+)")
# Attributes naming the computations an instruction calls.
_CALLED = re.compile(
    r"\b(calls|to_apply|body|condition|true_computation|false_computation)=%([\w.\-]+)"
)
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_CUSTOM_TARGET = re.compile(r'custom_call_target="([^"]*)"')

# Ops that pass a value on unchanged (up to layout or memory space, which a `copy` changes).
_FORWARDING = {
    "parameter",
    "get-tuple-element",
    "tuple",
    "bitcast",
    "copy-start",
    "copy-done",
    "while",
    "conditional",
    "call",
    "optimization-barrier",
}
_HOST_OPS = {"send", "send-done", "recv", "recv-done", "infeed", "outfeed"}
_CROSS_KV = re.compile(r"encoder_decoder_attention\W+(key|value)\W")


@dataclasses.dataclass
class Instruction:
  name: str
  shape: str  # as printed, with layout: 'bf16[512,384]{1,0:T(8,128)(2,1)}' or a tuple
  opcode: str
  operands: list[str]
  attributes: str
  computation: str
  argument: str = ""  # what the parentheses hold: a parameter's number, a constant's value

  @property
  def parameter_number(self) -> int:
    return int(self.argument)

  @property
  def dims(self) -> tuple[int, ...] | None:
    """The dimensions of an array shape, None for a tuple."""
    if self.shape.startswith("("):
      return None
    found = _ARRAY.match(self.shape)
    return tuple(int(d) for d in found.group(2).split(",") if d) if found else None

  def called(self) -> list[str]:
    names = [m.group(2) for m in _CALLED.finditer(self.attributes)]
    for group in _BRANCHES.findall(self.attributes):
      names += _OPERAND.findall(group)
    return names

  @property
  def op_name(self) -> str:
    found = _OP_NAME.search(self.attributes)
    return found.group(1).replace("\\'", "'") if found else ""


def _split_shape(rest: str) -> tuple[str, str]:
  """'bf16[2]{0} add(%a, %b), ...' -> ('bf16[2]{0}', 'add(%a, %b), ...'); tuple shapes too."""
  if rest.startswith("("):
    depth = 0
    for i, ch in enumerate(rest):
      depth += {"(": 1, ")": -1}.get(ch, 0)
      if depth == 0:
        return rest[: i + 1], rest[i + 1 :].lstrip()
  shape, _, tail = rest.partition(" ")
  return shape, tail


def _split_call(text: str) -> tuple[str, str, str]:
  """'add(%a, %b), metadata=...' -> ('add', '%a, %b', ', metadata=...')."""
  opcode, _, tail = text.partition("(")
  depth = 1
  for i, ch in enumerate(tail):
    depth += {"(": 1, ")": -1}.get(ch, 0)
    if depth == 0:
      return opcode, tail[:i], tail[i + 1 :]
  return opcode, tail, ""


def parse(text: str) -> tuple[dict[str, dict[str, Instruction]], str, dict[str, str]]:
  """Optimized HLO text -> ({computation: {name: Instruction}}, entry computation's name,
  {computation: its root instruction's name})."""
  computations: dict[str, dict[str, Instruction]] = {}
  roots: dict[str, str] = {}
  entry, current = "", None
  for line in text.splitlines():
    header = _COMPUTATION.match(line)
    if header and not line.startswith(" "):
      current = header.group(2)
      computations[current] = {}
      if header.group(1):
        entry = current
      continue
    if current is None:
      continue
    if line.startswith("}"):
      current = None
      continue
    found = _INSTRUCTION.match(line)
    if not found:
      continue
    shape, rest = _split_shape(found.group(3))
    opcode, operands, attributes = _split_call(rest)
    instruction = Instruction(
        found.group(2), shape, opcode, _OPERAND.findall(operands), attributes, current, operands
    )
    computations[current][instruction.name] = instruction
    if found.group(1):
      roots[current] = instruction.name
  if not entry:
    raise ValueError("no ENTRY computation in the HLO text: pass compiled.as_text().")
  return computations, entry, roots


@dataclasses.dataclass(frozen=True)
class Finding:
  kind: str  # 'host transfer', 'weight copy', 'cache copy', 'cross-attention K/V in the loop'
  instruction: str
  shape: str
  reads: str  # the weight's argument path or the loop state's shape

  def as_dict(self) -> dict:
    return dataclasses.asdict(self)


@dataclasses.dataclass
class LoopReport:
  """loops: the `while` instructions; loop_computations: how many computations they reach;
  problems: the findings (empty for a good decode); counts: instructions by opcode in the loop
  computations, for reading (e.g. 'dynamic-update-slice', 'copy-start')."""

  loops: list[str]
  loop_computations: int
  problems: list[Finding]
  counts: dict[str, int]

  def as_dict(self) -> dict:
    return {
        "loops": self.loops,
        "loop_computations": self.loop_computations,
        "problems": [f.as_dict() for f in self.problems],
        "counts": self.counts,
    }


class _Program:
  """The parsed module with the dataflow queries the checks need."""

  def __init__(self, text: str):
    self.computations, self.entry, self.roots = parse(text)
    self.callers: dict[str, list[Instruction]] = {}
    self._invariant: dict[tuple[str, str, int], bool] = {}
    for instructions in self.computations.values():
      for instruction in instructions.values():
        for name in instruction.called():
          self.callers.setdefault(name, []).append(instruction)

  def get(self, computation: str, name: str) -> Instruction:
    return self.computations[computation][name]

  def reachable(self, starts: Iterable[str]) -> set[str]:
    seen, todo = set(), list(starts)
    while todo:
      name = todo.pop()
      if name in seen or name not in self.computations:
        continue
      seen.add(name)
      for instruction in self.computations[name].values():
        todo += instruction.called()
    return seen

  def invariant(self, loop: Instruction, index: int) -> bool:
    """Whether the `while` passes element `index` of its state through its body unchanged."""
    key = (loop.computation, loop.name, index)
    if key not in self._invariant:
      self._invariant[key] = False  # a cycle through nested loops is not a proof.
      body = re.search(r"\bbody=%([\w.\-]+)", loop.attributes).group(1)
      root = self.get(body, self.roots[body])
      self._invariant[key] = (
          root.opcode == "tuple"
          and index < len(root.operands)
          and self._local_origin(body, root.operands[index], ()) == (0, (index,))
      )
    return self._invariant[key]

  def _local_origin(self, computation, name, index) -> tuple[int, tuple[int, ...]] | None:
    """(parameter number, element index) of `computation` that the value passes on unchanged
    (through forwarding ops and the invariant state of nested loops), or None."""
    for _ in range(1000):
      instruction = self.get(computation, name)
      op = instruction.opcode
      if op == "parameter":
        return instruction.parameter_number, index
      if op == "get-tuple-element":
        index = (int(_INDEX.search(instruction.attributes).group(1)),) + index
      elif op == "tuple":
        if not index:
          return None
        name, index = instruction.operands[index[0]], index[1:]
        continue
      elif op == "while":
        if not index or not self.invariant(instruction, index[0]):
          return None
      elif op == "copy-done":
        index = (0,) + index
      elif op == "copy-start":
        if index[:1] not in ((0,), (1,)):
          return None
        index = index[1:]
      elif op not in ("bitcast", "optimization-barrier"):
        return None
      if not instruction.operands:
        return None
      name = instruction.operands[0]
    return None

  def sources(self, computation: str, name: str, index: tuple[int, ...] = ()) -> set[str]:
    """The entry arguments (their op_name) whose contents the value `name` (element `index` of
    it, for a tuple) holds, passed on through forwarding ops, copies and calls; empty if it is
    computed."""
    return self._sources(computation, name, index, frozenset())

  def _sources(self, computation, name, index, seen) -> set[str]:
    key = (computation, name, index)
    if key in seen:
      return set()
    seen = seen | {key}
    instruction = self.get(computation, name)
    op = instruction.opcode
    if op == "parameter":
      number = instruction.parameter_number
      if computation == self.entry:
        return {instruction.op_name} if not index else set()
      out = set()
      for caller in self.callers.get(computation, []):
        out |= self._parameter_sources(caller, computation, number, index, seen)
      return out
    if op == "get-tuple-element":
      element = int(_INDEX.search(instruction.attributes).group(1))
      return self._sources(computation, instruction.operands[0], (element,) + index, seen)
    if op == "tuple":
      if not index:
        return set()
      return self._sources(computation, instruction.operands[index[0]], index[1:], seen)
    if op == "copy-done":  # element 0 of its copy-start: the copied value.
      return self._sources(computation, instruction.operands[0], (0,) + index, seen)
    if op in ("bitcast", "optimization-barrier", "copy", "transpose") and instruction.operands:
      # A re-laid-out weight (a copy made before the loop, say) still holds the weight.
      return self._sources(computation, instruction.operands[0], index, seen)
    if op == "copy-start" and instruction.operands and index[:1] in ((0,), (1,)):
      return self._sources(computation, instruction.operands[0], index[1:], seen)
    if op == "while" and index and self.invariant(instruction, index[0]):
      return self._sources(computation, instruction.operands[0], index, seen)
    return set()

  def _parameter_sources(self, caller, computation, number, index, seen) -> set[str]:
    """Sources of parameter `number` of `computation` as `caller` calls it."""
    op = caller.opcode
    where = caller.computation
    if op == "while":
      if not index or not self.invariant(caller, index[0]):
        return set()  # loop state that changes is computed, not an argument.
      return self._sources(where, caller.operands[0], index, seen)
    if op == "conditional":
      branches = caller.called()
      if computation not in branches:
        return set()
      return self._sources(where, caller.operands[1 + branches.index(computation)], index, seen)
    if number < len(caller.operands):  # fusion, call, map...
      return self._sources(where, caller.operands[number], index, seen)
    return set()


def _loop_state_shapes(program: _Program, loop: Instruction) -> set[tuple[int, ...]]:
  """Dimensions of the arrays of rank >= 3 that `loop` carries and changes."""
  shape = program.get(loop.computation, loop.name).shape
  elements = [m for m in _ARRAY.finditer(shape)]
  out = set()
  for i, element in enumerate(elements):
    dims = tuple(int(d) for d in element.group(2).split(",") if d)
    if len(dims) >= 3 and not program.invariant(loop, i):
      out.add(dims)
  return out


def analyze(text: str) -> LoopReport:
  """The per-iteration report of an optimized HLO module (`compiled.as_text()`)."""
  program = _Program(text)
  loops = [
      instruction
      for instructions in program.computations.values()
      for instruction in instructions.values()
      if instruction.opcode == "while"
  ]
  starts = []
  for loop in loops:
    starts += [
        m.group(2) for m in _CALLED.finditer(loop.attributes) if m.group(1) in ("body", "condition")
    ]
  in_loop = program.reachable(starts)
  cache_shapes = set()
  for loop in loops:
    cache_shapes |= _loop_state_shapes(program, loop)

  problems, counts = [], {}
  for computation in sorted(in_loop):
    for instruction in program.computations[computation].values():
      op = instruction.opcode
      counts[op] = counts.get(op, 0) + 1
      where = f"{computation}/{instruction.name}"
      target = _CUSTOM_TARGET.search(instruction.attributes)
      if op in _HOST_OPS or (
          op == "custom-call" and target and re.search("callback|host", target.group(1), re.I)
      ):
        problems.append(Finding("host transfer", where, instruction.shape, op))
        continue
      if op in ("copy", "transpose"):
        weights = sorted(
            s for s in program.sources(computation, instruction.operands[0]) if _is_weight(s)
        )
        if weights:
          problems.append(Finding("weight copy", where, instruction.shape, weights[0]))
        elif instruction.dims in cache_shapes:
          problems.append(Finding("cache copy", where, instruction.shape, "loop state"))
        continue
      if op in _FORWARDING:
        continue
      for operand in instruction.operands:
        cross = sorted(s for s in program.sources(computation, operand) if _CROSS_KV.search(s))
        if cross:
          problems.append(
              Finding("cross-attention K/V in the loop", where, instruction.shape, cross[0])
          )
          break
  return LoopReport(
      [loop.name for loop in loops], len(in_loop), problems, dict(sorted(counts.items()))
  )


def _is_weight(op_name: str) -> bool:
  return op_name.startswith("params")


def markdown(report: dict) -> str:
  """A report's `as_dict()` as Markdown: the verdict and each finding."""
  problems = report["problems"]
  lines = [
      f"Optimized HLO: {len(report['loops'])} while loop(s) reaching "
      f"{report['loop_computations']} computation(s); "
      + (
          "no host transfer, weight copy, cache copy or cross-attention K/V in them."
          if not problems
          else f"**{len(problems)} problem(s)** in them:"
      )
  ]
  by_kind: dict[str, list[dict]] = {}
  for finding in problems:
    by_kind.setdefault(finding["kind"], []).append(finding)
  for kind, findings in by_kind.items():
    first = findings[0]
    lines.append(
        f"- {len(findings)} {kind}(s), e.g. `{first['shape']}` at `{first['instruction']}` "
        f"reading {first['reads']}"
    )
  return "\n".join(lines)
