"""The setup wizard: Environment, Model, Data, Method and plan, Review."""
