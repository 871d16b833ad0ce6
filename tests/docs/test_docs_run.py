"""The shell commands of the pages on running a model (bench, serve, serving, sources), run as written
(tests/docs/doc_commands.py)."""

from tests.docs.doc_commands import line_tests

test_doc_command = line_tests("run")
