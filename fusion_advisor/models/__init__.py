"""Built-in models: the default model analysed when ``fusion-advisor analyze`` gets no file."""
