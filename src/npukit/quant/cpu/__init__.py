"""ONNX Runtime CPU specifics: this CPU's weight scheme (7-bit and pair-bounded grids), channel pairing, the float head, the int8 conv kernel choice."""
