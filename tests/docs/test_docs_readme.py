"""The shell commands of README.md, run as written (tests/docs/doc_commands.py)."""

from tests.docs.doc_commands import line_tests

test_doc_command = line_tests("readme")
