"""The symbolic fast path: the common forms of math answers parsed straight into sympy and compared.

Most symbolic answers are fractions, radicals, π, powers, simple polynomials and rational functions,
a few trigonometric or logarithmic terms. Building the sympy expression directly from the LaTeX is
far cheaper than math-verify's general parser, and sympy's own canonical form settles most
comparisons (√117 is 3√13, √2/2 is 1/√2); `cancel` settles rational functions, and a numeric check at
a few points (both sides, exact to 30 digits) settles identities such as tan²y + 1 = sec²y.

`parse` returns None for anything outside the subset (relations, sets, text, `\\pm`, matrices…): those
go to math-verify. `compare` returns None when it cannot decide either way.
"""

from __future__ import annotations

import re
from functools import lru_cache

import sympy

TOKEN = re.compile(r"\s*(\\[a-zA-Z]+|\d+\.\d*|\.\d+|\d|[A-Za-z]|\^|_|[-+*/()\[\]{}!|,'])")
GREEK = {
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "varepsilon",
    "zeta",
    "eta",
    "theta",
    "vartheta",
    "iota",
    "kappa",
    "lambda",
    "mu",
    "nu",
    "xi",
    "rho",
    "sigma",
    "tau",
    "upsilon",
    "phi",
    "varphi",
    "chi",
    "psi",
    "omega",
    "Gamma",
    "Delta",
    "Theta",
    "Lambda",
    "Xi",
    "Sigma",
    "Phi",
    "Psi",
    "Omega",
}
FUNCTIONS = {
    "sin": sympy.sin,
    "cos": sympy.cos,
    "tan": sympy.tan,
    "cot": sympy.cot,
    "sec": sympy.sec,
    "csc": sympy.csc,
    "arcsin": sympy.asin,
    "arccos": sympy.acos,
    "arctan": sympy.atan,
    "ln": sympy.log,
    "exp": sympy.exp,
    "sinh": sympy.sinh,
    "cosh": sympy.cosh,
    "tanh": sympy.tanh,
}
IGNORED = {"left", "right", "displaystyle", "limits", "big", "Big", "bigg", "Bigg"}
MAX_TOKENS = 200
POINTS = (sympy.Rational(7, 10), sympy.Rational(13, 7), sympy.Rational(-11, 5))


class Unsupported(Exception):
    """Outside the fast path's subset: the caller falls back to math-verify."""


def _prepare(text: str) -> str:
    text = re.sub(r"\^\s*\{?\s*\\circ\s*\}?|°", "", text)  # degrees
    text = re.sub(r"\\(?:mathrm|text|operatorname)\s*\{\s*e\s*\}", "e", text)
    text = re.sub(r"\\(?:mathrm|operatorname)\s*\{\s*([a-z]+)\s*\}", r"\\\1", text)  # \mathrm{sin} → \sin
    text = text.replace("\\cdot", "*").replace("\\times", "*").replace("\\div", "/")
    return re.sub(r"\\[dtc]frac", r"\\frac", text)


class _Parser:
    def __init__(self, text: str):
        self.tokens = []
        position = 0
        text = _prepare(text).strip()
        while position < len(text):
            match = TOKEN.match(text, position)
            if not match:
                raise Unsupported(f"cannot read {text[position : position + 10]!r}")
            token = match.group(1)
            if not (token.startswith("\\") and token[1:] in IGNORED):
                self.tokens.append(token)
            position = match.end()
            if len(self.tokens) > MAX_TOKENS:
                raise Unsupported("too long for the fast path")
        self.position = 0
        self.has_decimal = False

    def peek(self) -> str | None:
        return self.tokens[self.position] if self.position < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if token is None or (expected is not None and token != expected):
            raise Unsupported(f"expected {expected!r}, found {token!r}")
        self.position += 1
        return token

    def parse(self) -> sympy.Expr:
        value = self.expression()
        if self.peek() is not None:
            raise Unsupported(f"unexpected {self.peek()!r}")
        return value

    def expression(self) -> sympy.Expr:
        value = self.term()
        while self.peek() in ("+", "-"):
            sign = self.take()
            right = self.term()
            value = value + right if sign == "+" else value - right
        return value

    def term(self) -> sympy.Expr:
        start = self.position
        value = self.unary()
        while True:
            token = self.peek()
            if token == "*":
                self.take()
                value = value * self.unary()
            elif token == "/":
                self.take()
                value = value / self.unary()
            elif token == "\\frac" and self._mixed_number(start):
                value = value + self.power()  # 1\frac{4}{5} is 9/5, as a mixed number reads
            elif token is not None and self._starts_factor(token):
                value = value * self.power()  # implicit multiplication: 3\sqrt{2}, 2\pi, xy
            else:
                return value

    def _mixed_number(self, start: int) -> bool:
        """Whether the term so far is a bare whole number and a fraction of whole numbers follows."""
        whole = self.tokens[start : self.position]
        fraction = self.tokens[self.position : self.position + 8]
        return (
            bool(whole)
            and all(t.isdigit() for t in whole)
            and bool(re.match(r"\\frac\{(\d+)\}\{(\d+)\}|\\frac(\d)(\d)", "".join(fraction)))
        )

    def _starts_factor(self, token: str) -> bool:
        return (
            token in ("(", "{", "\\frac", "\\sqrt", "\\pi", "\\infty", "\\binom", "\\log")
            or token.isalpha()
            or token[0].isdigit()
            or token[0] == "."
            or (token.startswith("\\") and (token[1:] in GREEK or token[1:] in FUNCTIONS))
        )

    def unary(self) -> sympy.Expr:
        if self.peek() == "-":
            self.take()
            return -self.unary()
        if self.peek() == "+":
            self.take()
            return self.unary()
        return self.power()

    def power(self) -> sympy.Expr:
        base = self.postfix()
        if self.peek() == "^":
            self.take()
            exponent = self.group()
            return sympy.Pow(base, exponent)
        return base

    def postfix(self) -> sympy.Expr:
        value = self.atom()
        while self.peek() == "!":
            self.take()
            if not (value.is_Integer and 0 <= value <= 50):
                raise Unsupported("factorial of a large or non-integer value")
            value = sympy.factorial(value)
        return value

    def group(self) -> sympy.Expr:
        """A braced group, or a single token (`\\frac12`, `x^2`)."""
        token = self.peek()
        if token == "{":
            self.take()
            value = self.expression()
            self.take("}")
            return value
        if token is not None and token[0].isdigit() and "." not in token:
            self.take()
            return sympy.Integer(token)
        if token == "-":
            self.take()
            return -self.group()
        return self.atom()

    def atom(self) -> sympy.Expr:
        token = self.take()
        if token[0].isdigit() or token[0] == ".":
            return self._number(token)
        if token in ("(", "["):
            value = self.expression()
            self.take(")" if token == "(" else "]")
            return value
        if token == "{":
            value = self.expression()
            self.take("}")
            return value
        if token == "|":
            value = self.expression()
            self.take("|")
            return sympy.Abs(value)
        if token.isalpha():
            return self._symbol(token)
        if token.startswith("\\"):
            return self._command(token[1:])
        raise Unsupported(f"unexpected {token!r}")

    def _number(self, token: str) -> sympy.Expr:
        """Digits come one token each (so `\\frac12` is 1/2); consecutive ones form one number."""
        digits = token
        if "." not in digits:
            while (following := self.peek()) is not None and len(following) == 1 and following.isdigit():
                digits += self.take()
        if "." in digits:
            self.has_decimal = True
        return sympy.Rational(digits)

    def _symbol(self, name: str) -> sympy.Expr:
        if name == "e" and self.peek() != "_":
            return sympy.E
        if name == "i" and self.peek() != "_":
            return sympy.I  # in a final answer, i is the imaginary unit
        if self.peek() == "_":
            self.take()
            subscript = self.take()
            if subscript == "{":
                parts = []
                while self.peek() != "}":
                    part = self.take()
                    if not (part.isalnum()):
                        raise Unsupported("a subscript that is an expression")
                    parts.append(part)
                self.take("}")
                subscript = "".join(parts)
            elif not subscript.isalnum():
                raise Unsupported("an unusual subscript")
            name = f"{name}_{subscript}"
        if self.peek() == "'":
            raise Unsupported("a derivative")
        return sympy.Symbol(name)

    def _command(self, name: str) -> sympy.Expr:
        if name == "frac":
            numerator = self.group()
            return numerator / self.group()
        if name == "binom":
            top = self.group()
            return sympy.binomial(top, self.group())
        if name == "sqrt":
            if self.peek() == "[":
                self.take()
                index = self.expression()
                self.take("]")
                return sympy.root(self.group(), index)
            return sympy.sqrt(self.group())
        if name == "pi":
            return sympy.pi
        if name == "infty":
            return sympy.oo
        if name in GREEK:
            return sympy.Symbol(name)
        if name == "log":
            base = None
            if self.peek() == "_":
                self.take()
                base = self.group()
            argument = self._argument()
            return sympy.log(argument, base) if base is not None else sympy.log(argument)
        if name in FUNCTIONS:
            exponent = None
            if self.peek() == "^":
                self.take()
                exponent = self.group()
            value = FUNCTIONS[name](self._argument())
            return value**exponent if exponent is not None else value
        raise Unsupported(f"\\{name}")

    def _argument(self) -> sympy.Expr:
        if self.peek() in ("(", "{", "["):
            return self.atom()
        return self.power()


@lru_cache(maxsize=16384)
def parse(text: str) -> tuple[sympy.Expr, bool] | None:
    """(expression, written with a decimal) for an answer in the fast path's subset, else None."""
    try:
        parser = _Parser(text)
        value = parser.parse()
    except (Unsupported, TypeError, ValueError, ZeroDivisionError, RecursionError, sympy.SympifyError):
        return None
    if value.has(sympy.zoo, sympy.nan):
        return None
    return value, parser.has_decimal


def compare(gold: str, answer: str, precision: int = 6) -> bool | None:
    """True or False when both answers are in the subset and the comparison is conclusive; None otherwise."""
    left, right = parse(gold), parse(answer)
    if left is None or right is None:
        return None
    (a, a_decimal), (b, b_decimal) = left, right
    if a.has(sympy.oo) or b.has(sympy.oo):
        return a == b
    try:
        if a_decimal or b_decimal:
            return _close(a, b, precision)
        difference = a - b
        if difference == 0 or sympy.cancel(sympy.expand(difference)) == 0:
            return True
        return _numerically_zero(difference)
    except (TypeError, ValueError, ZeroDivisionError, RecursionError, AttributeError):
        return None


def _close(a: sympy.Expr, b: sympy.Expr, precision: int) -> bool | None:
    """Decimals involved: equal when both round to the same value at `precision` decimals (as math-verify)."""
    if a.free_symbols or b.free_symbols:
        return _numerically_zero(a - b, tolerance=sympy.Rational(1, 10**precision))
    left, right = sympy.N(a, 30), sympy.N(b, 30)
    if not (left.is_real and right.is_real):
        return None
    return round(float(left), precision) == round(float(right), precision)


def _numerically_zero(difference: sympy.Expr, tolerance: sympy.Expr | None = None) -> bool | None:
    """Evaluate at a few points: zero at all of them (to 30 digits) is equal; clearly non-zero at one is not."""
    symbols = sorted(difference.free_symbols, key=lambda s: s.name)
    if len(symbols) > 4:
        return None
    decided = 0
    for shift in range(len(POINTS)):
        values = {s: POINTS[(i + shift) % len(POINTS)] + i for i, s in enumerate(symbols)}
        value = sympy.N(difference.subs(values), 30)
        if value.has(sympy.zoo, sympy.nan) or not value.is_number:
            continue
        magnitude = abs(complex(value))
        if magnitude > (float(tolerance) if tolerance is not None else 1e-20) * 10:
            return False
        decided += 1
        if not symbols:
            break
    return True if decided else None
