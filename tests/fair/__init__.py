"""Fair (issue 24): the admission, the fetch turns, the admin calls, real forking workers, replays."""
