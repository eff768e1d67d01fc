"""Procedural game positions with a clear best result (verifier `game`).

- `tictactoe`: positions reached by random legal play, not over, where the moves differ in value (some
  win or hold the draw, others lose it). Level by the empty squares left (more is deeper).
- `connect4`: 6 × 7 positions after random play where, within a 4-ply search, some moves win or hold and
  others lose (a win to take, a threat to block).
The problem's `answer` is the position (`game|board`); the verifier values the response's move.
"""

from __future__ import annotations

import random

from tasks.generators.base import Generated
from tasks.verifiers.games import (
    COLUMNS,
    ROWS,
    c4_drop,
    c4_move_values,
    c4_to_move,
    c4_winner,
    ttt_move_values,
    ttt_to_move,
    ttt_winner,
)

TTT_EMPTY = {1: (2, 3), 2: (4, 5), 3: (6, 7), 4: (8, 8)}  # empty squares left, by level
C4_PLIES = {1: (4, 8), 2: (8, 14), 3: (14, 20), 4: (20, 28)}


def _render(board: str, width: int) -> str:
    return "\n".join(" ".join(board[i : i + width]) for i in range(0, len(board), width))


def tictactoe(rng: random.Random, level: int = 2) -> Generated:
    low, high = TTT_EMPTY[level]
    while True:
        board = "." * 9
        target = rng.randint(low, high)
        while board.count(".") > target and ttt_winner(board) is None:
            cell = rng.choice([i for i, c in enumerate(board) if c == "."])
            board = board[:cell] + ttt_to_move(board) + board[cell + 1 :]
        if ttt_winner(board) is not None or board.count(".") == 0:
            continue
        values = ttt_move_values(board)
        if len(set(values.values())) > 1:  # moves differ: the task discriminates
            break
    player, best = ttt_to_move(board), max(values.values())
    move = min(cell for cell, value in values.items() if value == best)
    outcome = {1: "wins", 0: "draws", -1: "loses"}[best]
    prompt = (
        f"Tic-tac-toe, {player} to move (rows and columns numbered 1-3 from the top left, . is empty):\n"
        f"{_render(board, 3)}\n\nGive a move that wins if a win can be forced, or else keeps the draw, against "
        "perfect play. Answer as <answer>row col</answer>."
    )
    return Generated(
        prompt=prompt,
        answer=f"tictactoe|{board}",
        solution=f"With best play {player} {outcome}. <answer>{move // 3 + 1} {move % 3 + 1}</answer>",
        steps=[],
        params={"game": "tictactoe", "board": board, "best": best},
    )


def connect4(rng: random.Random, level: int = 2) -> Generated:
    low, high = C4_PLIES[level]
    while True:
        board, plies = "." * (ROWS * COLUMNS), rng.randint(low, high)
        for _ in range(plies):
            columns = [c for c in range(COLUMNS) if board[c] == "."]
            board = c4_drop(board, rng.choice(columns), c4_to_move(board))
            if c4_winner(board) is not None:
                break
        if c4_winner(board) is not None or "." not in board:
            continue
        values = c4_move_values(board)
        if len(set(values.values())) > 1:
            break
    player, best = c4_to_move(board), max(values.values())
    move = min(column for column, value in values.items() if value == best)
    prompt = (
        f"Connect Four on a 6 × 7 board, {player} to move (columns numbered 1-7 from the left, . is empty, "
        f"pieces fall to the lowest empty row):\n{_render(board, COLUMNS)}\n\nGive the column of a move that "
        "wins if a win can be forced, or else does not lose. Answer as <answer>column</answer>."
    )
    return Generated(
        prompt=prompt,
        answer=f"connect4|{board}",
        solution=f"<answer>{move + 1}</answer>",
        steps=[],
        params={"game": "connect4", "board": board, "best": best},
    )
