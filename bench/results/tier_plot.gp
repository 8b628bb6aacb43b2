# Hit rate against host-tier size at 32,001 GPU blocks (figures of bench/results/tier.md).
#   gnuplot bench/results/tier_plot.gp    -> bench/results/tier.png
set terminal pngcairo size 800,500 noenhanced
set output 'bench/results/tier.png'
set title 'Mooncake conversation trace: 32,001 GPU blocks + a host tier'
set xlabel 'host blocks'
set ylabel 'hit rate = prefill saved (%)'
set logscale x
set xrange [25000:2600000]
set yrange [0:40]
set key top left
set grid
plot 'bench/results/tier_sweep.dat' using 1:2 with linespoints lw 2 title 'write_back', \
     '' using 1:3 with linespoints lw 2 title 'write_through', \
     '' using 1:4 with linespoints lw 2 title 'write_through_selective (k=2)', \
     36.651 with lines dt 2 lw 1 title 'one 2,048,001-block GPU pool (36.65%)'
