# Hit rate against GPU pool size per eviction policy (figures of bench/results/eviction.md).
#   gnuplot bench/results/eviction_plot.gp    -> bench/results/eviction.png
# belady is the replay's clairvoyant bound (it reads the future): an offline reference, not a
# policy an engine can run; reuse-oracle(-mru) (2026-12-05) are told only whether each block is
# used again, also offline.
set terminal pngcairo size 1000,450 noenhanced
set output 'bench/results/eviction.png'
set multiplot layout 1,2
set xlabel 'GPU blocks (16 tokens each)'
set ylabel 'hit rate = prefill saved (%)'
set logscale x
set grid
set key top left
set title 'Mooncake conversation trace (12,031 requests)'
set xrange [7000:600000]
set yrange [0:55]
plot 'bench/results/eviction_sweep.dat' using 1:2 with linespoints lw 2 title 'lru (default)', \
     '' using 1:3 with linespoints lw 2 title 'slru', \
     '' using 1:4 with linespoints lw 2 title 's3fifo', \
     '' using 1:5 with linespoints lw 2 title 'lineage', \
     '' using 1:7 with linespoints lw 3 lc rgb 'black' title 'adaptive', \
     '' using 1:6 with linespoints lw 2 dt 2 title 'belady (offline bound)', \
     '' using 1:8 with lines lw 1 dt 3 lc rgb 'gray40' title 'reuse-oracle (offline)', \
     '' using 1:9 with lines lw 1 dt 4 lc rgb 'gray20' title 'reuse-oracle-mru (offline)'
set title 'generated agents workload (1,000 requests, seed 1)'
set xrange [1800:70000]
set yrange [40:100]
set key bottom right
plot 'bench/results/eviction_agents_sweep.dat' using 1:2 with linespoints lw 2 title 'lru (default)', \
     '' using 1:3 with linespoints lw 2 title 'slru', \
     '' using 1:4 with linespoints lw 2 title 's3fifo', \
     '' using 1:5 with linespoints lw 2 title 'lineage', \
     '' using 1:7 with linespoints lw 3 lc rgb 'black' title 'adaptive', \
     '' using 1:6 with linespoints lw 2 dt 2 title 'belady (offline bound)', \
     '' using 1:8 with lines lw 1 dt 3 lc rgb 'gray40' title 'reuse-oracle (offline)', \
     '' using 1:9 with lines lw 1 dt 4 lc rgb 'gray20' title 'reuse-oracle-mru (offline)'
unset multiplot
