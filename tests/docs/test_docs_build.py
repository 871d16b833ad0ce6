"""The shell commands of the pages on making a model, and of any page `GROUPS` does not name, run as
written (tests/docs/doc_commands.py)."""

from tests.docs.doc_commands import line_tests

test_doc_command = line_tests("build")
