"""Games with a clear outcome: a move is right when it keeps the best result the position allows.

- `tictactoe`: the position is solved exactly (minimax over every continuation); a move scores 1 when it
  wins where a win can be forced, or draws where a draw is the best either side can force.
- `connect4` (6 × 7): a depth-limited negamax (`depth` plies, default 4) values every legal move as a
  forced win, a forced loss or undecided within the horizon; a move scores 1 when its value is the best
  of them. The generator keeps positions where moves differ (a win to take, a threat to block).
The answer: `<answer>row col</answer>` for tic-tac-toe (1-3 each), `<answer>col</answer>` for Connect
Four (1-7), else the last such numbers of the response. An illegal move (occupied, out of the board, a
full column) scores 0. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any

from tasks.verifiers.base import Verdict, failed, register

ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
LINES = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)]
ROWS, COLUMNS = 6, 7


# ---- tic-tac-toe -------------------------------------------------------------------------------------------
def ttt_winner(board: str) -> str | None:
    for a, b, c in LINES:
        if board[a] != "." and board[a] == board[b] == board[c]:
            return board[a]
    return None


def ttt_to_move(board: str) -> str:
    return "X" if board.count("X") == board.count("O") else "O"


@cache
def ttt_value(board: str) -> int:
    """+1 if the player to move can force a win, 0 a draw, −1 if the opponent can."""
    if ttt_winner(board) is not None:
        return -1  # the player who just moved won
    if "." not in board:
        return 0
    player = ttt_to_move(board)
    return max(-ttt_value(board[:i] + player + board[i + 1 :]) for i, cell in enumerate(board) if cell == ".")


def ttt_move_values(board: str) -> dict[int, int]:
    """Each legal move (cell 0-8) with its value for the player making it."""
    player = ttt_to_move(board)
    return {i: -ttt_value(board[:i] + player + board[i + 1 :]) for i, cell in enumerate(board) if cell == "."}


# ---- Connect Four ------------------------------------------------------------------------------------------
def c4_drop(board: str, column: int, player: str) -> str | None:
    """The board (row-major from the top, 6 × 7) after `player` drops in `column` (0-6); None when it is full."""
    index = _landing(board, column)
    return None if index is None else board[:index] + player + board[index + 1 :]


def _landing(board: str, column: int) -> int | None:
    for row in range(ROWS - 1, -1, -1):
        if board[row * COLUMNS + column] == ".":
            return row * COLUMNS + column
    return None


def _wins_at(board: str, index: int) -> bool:
    """Whether the piece at `index` is part of four in a row (only lines through it are looked at)."""
    player, row, column = board[index], index // COLUMNS, index % COLUMNS
    for dr, dc in ((0, 1), (1, 0), (1, 1), (1, -1)):
        count = 1
        for sign in (1, -1):
            r, c = row + sign * dr, column + sign * dc
            while 0 <= r < ROWS and 0 <= c < COLUMNS and board[r * COLUMNS + c] == player:
                count, r, c = count + 1, r + sign * dr, c + sign * dc
        if count >= 4:
            return True
    return False


def c4_winner(board: str) -> str | None:
    for index, cell in enumerate(board):
        if cell != "." and _wins_at(board, index):
            return cell
    return None


def c4_to_move(board: str) -> str:
    return "X" if board.count("X") == board.count("O") else "O"


@lru_cache(maxsize=200_000)
def c4_value(board: str, depth: int) -> int:
    """Negamax within `depth` plies for the player to move, in a position nobody has won yet: +1 forced win,
    −1 forced loss, 0 undecided within the horizon (or a draw)."""
    if depth == 0 or "." not in board:
        return 0
    player, best = c4_to_move(board), -1
    for column in range(COLUMNS):
        index = _landing(board, column)
        if index is None:
            continue
        child = board[:index] + player + board[index + 1 :]
        value = 1 if _wins_at(child, index) else -c4_value(child, depth - 1)
        if value > best:
            best = value
            if best == 1:
                break
    return best if any(board[c] == "." for c in range(COLUMNS)) else 0


def c4_move_values(board: str, depth: int = 4) -> dict[int, int]:
    player, values = c4_to_move(board), {}
    for column in range(COLUMNS):
        index = _landing(board, column)
        if index is not None:
            child = board[:index] + player + board[index + 1 :]
            values[column] = 1 if _wins_at(child, index) else -c4_value(child, depth - 1)
    return values


# ---- the verifier ------------------------------------------------------------------------------------------
def _numbers(response: str) -> list[int]:
    tagged = ANSWER.findall(response)
    text = tagged[-1] if tagged else response[-200:]
    return [int(n) for n in re.findall(r"\d+", text)]


@register("game")
@dataclass
class GameVerifier:
    """Reward 1 for a legal move that keeps the position's best result (see the module docstring)."""

    depth: int = 4  # Connect Four: plies the negamax looks ahead
    name: str = "game"
    version: str = "1.0"

    def verify(self, problem: Mapping[str, Any], response: str) -> Verdict:
        game, board = str(problem.get("answer") or "|").split("|", 1)[0], _board_of(problem)
        if game not in ("tictactoe", "connect4") or board is None:
            return Verdict(0.0, None, {"reason": "the problem carries no game position"})
        numbers = _numbers(response)
        if game == "tictactoe":
            if len(numbers) < 2:
                return failed("no move (row col)")
            row, column = numbers[-2], numbers[-1]
            if not (1 <= row <= 3 and 1 <= column <= 3):
                return failed("the move is off the board", move=[row, column])
            values, move = ttt_move_values(board), (row - 1) * 3 + (column - 1)
        else:
            if not numbers:
                return failed("no move (column)")
            column = numbers[-1]
            if not 1 <= column <= COLUMNS:
                return failed("the move is off the board", move=column)
            values, move = c4_move_values(board, self.depth), column - 1
        if move not in values:
            return failed("an illegal move (occupied or full)", move=move)
        best = max(values.values())
        right = values[move] == best
        outcome = {1: "win", 0: "draw or undecided", -1: "loss"}
        return Verdict(
            float(right),
            right,
            {
                "move": move,
                "value": outcome[values[move]],
                "best": outcome[best],
                "reason": None if right else "a move that gives away the best result",
            },
        )


def _board_of(problem: Mapping[str, Any]) -> str | None:
    """The position: `game|board` in the answer field, as the games generator writes it."""
    answer = str(problem.get("answer") or "")
    if "|" not in answer:
        return None
    game, board = answer.split("|", 1)
    size = 9 if game == "tictactoe" else ROWS * COLUMNS
    return board if len(board) == size and set(board) <= {"X", "O", "."} else None
