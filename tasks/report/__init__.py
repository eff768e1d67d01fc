"""`rlvr report`: the frames behind each plot (`data.py`), the figures (`plots.py`), one self-contained
HTML file (`html.py`), and the stage that ties them to a lake (`stage.py`). No Prefect here.

May import: storage only (the `independent-stages` contract).
"""
