"""Environments for the end-to-end episode tests: ``Tick`` answers every turn with a numbered observation and a
reward of 0.1 per turn until its third; ``Broken`` raises on its first step."""


class Tick:
    def __init__(self, turns: int = 3):
        self.turns = turns

    def reset(self, row):
        return {"turn": 0, "answer": row.get("answer")}

    def step(self, state, text):
        state["turn"] += 1
        if state["turn"] >= self.turns:
            return None, 0.1, True
        return f"<r>{state['turn']}</r>", 0.1, False


class Broken(Tick):
    def step(self, state, text):
        raise ValueError(f"cannot read {text[:5]!r}")
