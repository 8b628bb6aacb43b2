set terminal pngcairo size 800,500
set output 'bench/results/router.png'
set title 'Mooncake conversation trace: K engines x 32,001 blocks, prompt tokens served from cache'
set xlabel 'engines (each its own pool of 32,001 blocks)'
set ylabel 'hit rate = prefill saved (%)'
set xtics (1,2,4,8)
set logscale x 2
set xrange [0.9:9]
set key top left
set grid
plot 'bench/results/router_sweep.dat' using 1:2 with linespoints lw 2 title 'kv router (events through KVIndexer)', \
     '' using 1:3 with linespoints lw 2 title 'round robin'
