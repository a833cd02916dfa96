"""SV's binned acceptance table P(accept | S, A): its bins, its fitting and its lookup."""
