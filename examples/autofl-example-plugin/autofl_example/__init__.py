"""An example autofl plugin: one method, one model, one dataset, found through entry points."""
