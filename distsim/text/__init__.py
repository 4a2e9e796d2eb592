"""The textual format of DistIR: one grammar, printed and parsed."""
from .parser import Parser, parse_function, parse_module, parse_type_text
from .printer import (print_attr, print_function, print_module, print_op, print_program,
                      print_type)

__all__ = ["Parser", "parse_function", "parse_module", "parse_type_text", "print_attr",
           "print_function", "print_module", "print_op", "print_program", "print_type"]
from . import sharding_syntax  # noqa: F401,E402  (meshes and DTensor types in the text format)
