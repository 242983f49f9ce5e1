"""An environment that answers every turn with a tool message (chat messages, not text), for the tests of
observation turns rendered by the policy's chat template (loaded by path)."""


class ToolMessages:
    def reset(self, row):
        return {"turns": 0}

    def step(self, state, text):
        state["turns"] += 1
        return [{"role": "tool", "content": str(7 * state["turns"])}], 0.0, False
