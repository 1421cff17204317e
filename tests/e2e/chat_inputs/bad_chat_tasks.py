"""A task module registering an instruction task from a file with an empty completion (the
`spot_jax.train` row of tests/e2e/cli_errors.jsonl)."""
import os

import tasks

tasks.register_chat_task("bad_chat_v1", train=os.path.join(os.path.dirname(__file__),
                                                           "empty_completion.jsonl"),
                         tokenizer="embedded_decoder")
