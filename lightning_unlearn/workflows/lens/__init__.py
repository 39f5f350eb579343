"""LENS workflows: base answers, annotation round trip, forget sets and calibration (``prepare``), the trajectory
summary (``summary``) and re-scoring saved generations (``rescore``)."""
