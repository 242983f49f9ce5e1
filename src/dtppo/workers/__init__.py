"""Plain worker classes: the policy and the critic, each owning its model, optimizer and scheduler."""
