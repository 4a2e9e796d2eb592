"""Parse the DistIR textual format written by :mod:`distsim.text.printer`.

Errors are :class:`ParseError` with the source name, line and column. The
parser builds the program as written (declared result types); run the
verifier to check it. A fused op (a coarsened program) holds the function
of the input that its ``segment`` attribute names. Each op records where
it was written (``op.meta["loc"]``, see :mod:`distsim.ir.source`), so that
errors found later name the file and line.
"""
from __future__ import annotations

import json
import re
from typing import Callable, Dict, List, Optional, Tuple

from ..errors import ConfigError, ParseError, quoted_short
from ..ir.core import Function, Module, Op, Value
from ..ir.ops_fused import FUSED
from ..ir.source import LOC, SourceLoc
from ..ir.types import DType, TensorType, Type

_TOKEN = re.compile(r"""
    (?P<ws>[ \t\r]+|\#[^\n]*)
  | (?P<nl>\n)
  | (?P<value>%[A-Za-z0-9_][A-Za-z0-9_.\-]*)
  | (?P<symbol>@[A-Za-z0-9_][A-Za-z0-9_.\-]*)
  | (?P<arrow>->)
  | (?P<number>[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?)
  | (?P<string>"(?:[^"\\\n]|\\.)*")
  | (?P<ident>-?[A-Za-z_][A-Za-z0-9_.]*)
  | (?P<punct>[()\[\]{},:=<>])
""", re.VERBOSE)


# Bounds on what a well-formed file can contain: deeper nesting or longer
# integers are rejected with a ParseError (not a RecursionError or a
# ValueError from int()). Integers are int64: MIN_INT is allowed, since
# ONNX exports write it as the end of a reversed slice (x[::-1]).
MAX_NESTING = 64
MAX_INT = 2 ** 63 - 1
MIN_INT = -2 ** 63


class Token:
    __slots__ = ("kind", "text", "line", "col")

    def __init__(self, kind: str, text: str, line: int, col: int) -> None:
        self.kind, self.text, self.line, self.col = kind, text, line, col

    def __repr__(self) -> str:
        return f"{self.kind}:{self.text!r}@{self.line}:{self.col}"


def tokenize(text: str, source: str = "<string>") -> List[Token]:
    tokens: List[Token] = []
    pos, line, line_start = 0, 1, 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ParseError(f"unexpected character {text[pos]!r}", source, line,
                             pos - line_start + 1)
        kind = m.lastgroup
        if kind == "nl":
            line += 1
            line_start = m.end()
        elif kind != "ws":
            tokens.append(Token(kind, m.group(), line, m.start() - line_start + 1))
        pos = m.end()
    tokens.append(Token("eof", "", line, pos - line_start + 1))
    return tokens


# Extra type syntaxes (e.g. sharded tensors) register a parser keyed by the
# token that follows a tensor type's closing bracket.
TypeSuffixParser = Callable[["Parser", TensorType], Type]
_TYPE_SUFFIXES: Dict[str, TypeSuffixParser] = {}
# Extra top-level declarations (e.g. ``mesh``) register a parser by keyword.
_DECLARATIONS: Dict[str, Callable[["Parser", Module], None]] = {}


def register_type_suffix(token_text: str, parser: TypeSuffixParser) -> None:
    _TYPE_SUFFIXES[token_text] = parser


def register_declaration(keyword: str, parser: Callable[["Parser", Module], None]) -> None:
    _DECLARATIONS[keyword] = parser


class Parser:
    """Recursive descent over the token list; ``parse_x`` consumes an x or
    fails, ``parse_optional_x`` returns None when there is none."""

    def __init__(self, text: str, source: str = "<string>") -> None:
        self.source = source
        self.tokens = tokenize(text, source)
        self.pos = 0
        self.module: Optional[Module] = None
        self._fused: List[Tuple[Op, "Token"]] = []   # fused ops and where they are

    # -- token helpers -------------------------------------------------
    @property
    def peek(self) -> Token:
        return self.tokens[self.pos]

    def next(self) -> Token:
        tok = self.tokens[self.pos]
        if tok.kind != "eof":
            self.pos += 1
        return tok

    def error(self, message: str, tok: Optional[Token] = None) -> ParseError:
        tok = tok or self.peek
        return ParseError(message, self.source, tok.line, tok.col)

    def describe(self, tok: Token) -> str:
        return "end of input" if tok.kind == "eof" else repr(tok.text)

    def expect(self, text: str) -> Token:
        tok = self.peek
        if tok.text != text or tok.kind == "string":
            raise self.error(f"expected '{text}', found {self.describe(tok)}")
        return self.next()

    def accept(self, text: str) -> bool:
        if self.peek.text == text and self.peek.kind != "string":
            self.next()
            return True
        return False

    def expect_kind(self, kind: str, what: str) -> Token:
        tok = self.peek
        if tok.kind != kind:
            raise self.error(f"expected {what}, found {self.describe(tok)}")
        return self.next()

    def parse_int(self, what: str = "an integer") -> int:
        tok = self.expect_kind("number", what)
        try:
            value = int(tok.text)
        except ValueError:
            raise self.error(f"expected {what}, found {quoted_short(tok.text)}", tok) from None
        if not MIN_INT <= value <= MAX_INT:
            raise self.error(f"{what} {quoted_short(tok.text)} is out of range (-2^63 .. 2^63 - 1)",
                             tok)
        return value

    # -- types ---------------------------------------------------------
    def parse_type(self) -> Type:
        tok = self.expect_kind("ident", "a type such as f32[4,4]@0")
        try:
            dtype = DType.parse(tok.text)
        except ConfigError as e:
            raise self.error(str(e), tok) from None
        self.expect("[")
        dims: List[int] = []
        if not self.accept("]"):
            while True:
                dim_tok = self.peek
                d = self.parse_int("a dimension")
                if d < 0:
                    raise self.error(f"negative dimension {d}", dim_tok)
                dims.append(d)
                if self.accept("]"):
                    break
                self.expect(",")
        device = None
        if self.peek.kind == "symbol" and self.peek.text[1:].isdigit():
            dev_tok = self.next()
            if len(dev_tok.text) > 19:
                raise self.error(f"device {quoted_short(dev_tok.text)} is out of range", dev_tok)
            device = int(dev_tok.text[1:])
        t = TensorType(tuple(dims), dtype, device)
        suffix = _TYPE_SUFFIXES.get(self.peek.text)
        if suffix is not None and self.peek.kind != "string":
            return suffix(self, t)
        return t

    # -- attributes ----------------------------------------------------
    def parse_attr_value(self, depth: int = 0):
        tok = self.peek
        if depth > MAX_NESTING:
            raise self.error(f"attribute value nested deeper than {MAX_NESTING} lists")
        if tok.kind == "number":
            if any(c in tok.text for c in ".eE"):
                self.next()
                return float(tok.text)
            return self.parse_int("an integer attribute")
        if tok.kind == "string":
            self.next()
            try:
                return json.loads(tok.text)
            except ValueError as e:
                raise self.error(f"bad string {quoted_short(tok.text)}: {e.args[0].split(':')[0]}",
                                 tok) from None
        if tok.kind == "ident":
            words = {"true": True, "false": False, "inf": float("inf"), "-inf": float("-inf"),
                     "nan": float("nan")}
            if tok.text in words:
                self.next()
                return words[tok.text]
        if self.accept("["):
            items = []
            if not self.accept("]"):
                while True:
                    items.append(self.parse_attr_value(depth + 1))
                    if self.accept("]"):
                        break
                    self.expect(",")
            return tuple(items)
        raise self.error(f"expected an attribute value, found {self.describe(tok)}")

    def parse_attrs(self) -> Dict[str, object]:
        attrs: Dict[str, object] = {}
        if not self.accept("{"):
            return attrs
        if self.accept("}"):
            return attrs
        while True:
            key_tok = self.expect_kind("ident", "an attribute name")
            if key_tok.text in attrs:
                raise self.error(f"attribute '{key_tok.text}' given twice", key_tok)
            self.expect("=")
            attrs[key_tok.text] = self.parse_attr_value()
            if self.accept("}"):
                return attrs
            self.expect(",")

    # -- functions -----------------------------------------------------
    def parse_value_use(self, env: Dict[str, Value]) -> Value:
        tok = self.expect_kind("value", "a value such as %x")
        name = tok.text[1:]
        if name not in env:
            raise self.error(f"use of undefined value %{name}", tok)
        return env[name]

    def parse_function(self) -> Function:
        self.expect("func")
        name_tok = self.expect_kind("symbol", "a function name such as @main")
        function = Function(name_tok.text[1:])
        env: Dict[str, Value] = {}
        self.expect("(")
        if not self.accept(")"):
            while True:
                tok = self.expect_kind("value", "a parameter such as %x")
                if tok.text[1:] in env:
                    raise self.error(f"parameter %{tok.text[1:]} declared twice", tok)
                self.expect(":")
                v = Value(tok.text[1:], self.parse_type())
                env[v.name] = v
                function.inputs.append(v)
                if self.accept(")"):
                    break
                self.expect(",")
        self.expect("->")
        self.expect("(")
        result_types: List[Type] = []
        if not self.accept(")"):
            while True:
                result_types.append(self.parse_type())
                if self.accept(")"):
                    break
                self.expect(",")
        self.expect("{")
        while not (self.peek.kind == "ident" and self.peek.text == "return"):
            if self.peek.kind == "eof":
                raise self.error("missing 'return' before end of input")
            function.ops.append(self.parse_op(env))
        ret_tok = self.expect("return")
        if self.peek.kind == "value":
            while True:
                function.outputs.append(self.parse_value_use(env))
                if not self.accept(","):
                    break
        self.expect("}")
        if len(result_types) != len(function.outputs) or any(
                t != v.type for t, v in zip(result_types, function.outputs)):
            raise self.error(f"function @{function.name} returns values whose types differ "
                             f"from its declared result types", ret_tok)
        return function

    def parse_op(self, env: Dict[str, Value]) -> Op:
        start = self.peek
        out_toks: List[Token] = []
        if self.peek.kind == "value":
            while True:
                out_toks.append(self.expect_kind("value", "a result such as %y"))
                if not self.accept(","):
                    break
            self.expect("=")
        type_tok = self.expect_kind("ident", "an op type")
        self.expect("(")
        inputs: List[Value] = []
        if not self.accept(")"):
            while True:
                inputs.append(self.parse_value_use(env))
                if self.accept(")"):
                    break
                self.expect(",")
        attrs = self.parse_attrs()
        types: List[Type] = []
        if out_toks:
            self.expect(":")
            while True:
                types.append(self.parse_type())
                if not self.accept(","):
                    break
        if len(types) != len(out_toks):
            raise self.error(f"{len(out_toks)} results but {len(types)} result types", start)
        outputs = []
        for tok, t in zip(out_toks, types):
            name = tok.text[1:]
            if name in env:
                raise self.error(f"value %{name} is defined twice", tok)
            v = Value(name, t)
            env[name] = v
            outputs.append(v)
        op = Op(type_tok.text, inputs, outputs, attrs,
                meta={LOC: SourceLoc(self.source, start.line)})
        if op.op_type == FUSED:   # its segment is linked once the module is read
            self._fused.append((op, type_tok))
        return op

    def parse_module(self) -> Module:
        module = Module()
        self.module = module
        while self.peek.kind != "eof":
            tok = self.peek
            if tok.text == "func":
                f = self.parse_function()
                if f.name in module.functions:
                    raise self.error(f"function @{f.name} defined twice", tok)
                module.add(f)
            elif tok.text in _DECLARATIONS:
                _DECLARATIONS[tok.text](self, module)
            else:
                raise self.error(f"expected 'func', found {self.describe(tok)}")
        if not module.functions:
            raise self.error("no function in input")
        self._link_segments(module)
        return module

    def _link_segments(self, module: Module) -> None:
        """Give each fused op the module function its ``segment`` names
        (printed after the function using it: see ``print_program``)."""
        for op, tok in self._fused:
            name = op.attrs.get("segment")
            segment = module.functions.get(name) if isinstance(name, str) else None
            if segment is None:
                raise self.error(f"fused op: its segment @{name} is not a function of this input",
                                 tok)
            op.subfunctions = (segment,)


def parse_module(text: str, source: str = "<string>") -> Module:
    return Parser(text, source).parse_module()


def parse_function(text: str, source: str = "<string>") -> Function:
    """Parse text holding exactly one function."""
    module = parse_module(text, source)
    if len(module.functions) != 1:
        raise ParseError(f"expected one function, found {len(module.functions)}", source)
    return module.main


def parse_type_text(text: str) -> Type:
    p = Parser(text)
    t = p.parse_type()
    if p.peek.kind != "eof":
        raise p.error(f"unexpected {p.describe(p.peek)} after type")
    return t
