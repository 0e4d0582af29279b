"""Helpers rules use to build replacement nodes while keeping the author's layout."""

from __future__ import annotations

import libcst as cst


def expr(code: str) -> cst.BaseExpression:
    return cst.parse_expression(code)


def add_keyword(call: cst.Call, keyword: str, value: cst.BaseExpression | str) -> cst.Call:
    """`f(a, b)` -> `f(a, b, keyword=value)`, following a multi-line, trailing-comma layout when present."""
    if isinstance(value, str):
        value = expr(value)
    new_arg = cst.Arg(value=value, keyword=cst.Name(keyword),
                      equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))
    args = list(call.args)
    if not args:
        return call.with_changes(args=[new_arg])
    last = args[-1]
    previous = args[-2].comma.whitespace_after if len(args) > 1 and isinstance(args[-2].comma, cst.Comma) \
        else call.whitespace_before_args
    if isinstance(last.comma, cst.Comma) and isinstance(last.comma.whitespace_after, cst.ParenthesizedWhitespace) \
            and isinstance(previous, cst.ParenthesizedWhitespace):
        # one argument per line: the last argument keeps its own line's comment; the new one goes on a new
        # line, indented like the arguments, and the lines before `)` stay before `)`
        after_last = last.comma.whitespace_after
        args[-1] = last.with_changes(comma=last.comma.with_changes(whitespace_after=cst.ParenthesizedWhitespace(
            first_line=after_last.first_line, empty_lines=(), indent=previous.indent, last_line=previous.last_line)))
        args.append(new_arg.with_changes(comma=last.comma.with_changes(
            whitespace_before=cst.SimpleWhitespace(""),
            whitespace_after=after_last.with_changes(first_line=cst.TrailingWhitespace()))))
    elif isinstance(last.comma, cst.Comma):  # trailing comma: the new argument takes the old last's place
        separator = args[-2].comma if len(args) > 1 and isinstance(args[-2].comma, cst.Comma) else cst.Comma(
            whitespace_after=call.whitespace_before_args
            if isinstance(call.whitespace_before_args, cst.ParenthesizedWhitespace) else cst.SimpleWhitespace(" "))
        args[-1] = last.with_changes(comma=separator)
        args.append(new_arg.with_changes(comma=last.comma))
    else:
        # the whitespace before `)` stays before `)`
        args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")),
                                     whitespace_after_arg=cst.SimpleWhitespace(""))
        args.append(new_arg.with_changes(whitespace_after_arg=last.whitespace_after_arg))
    return call.with_changes(args=args)


def replace_keyword_value(call: cst.Call, keyword: str, value: cst.BaseExpression | str) -> cst.Call:
    if isinstance(value, str):
        value = expr(value)
    return call.with_changes(args=[
        arg.with_changes(value=value) if arg.keyword is not None and arg.keyword.value == keyword else arg
        for arg in call.args
    ])
